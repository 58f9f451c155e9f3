/*
 * test_strings.c - the checks and sanitizer for strings from tenants and peers (common/util.c):
 * valid UTF-8 passes, invalid encodings, control and bidirectional formatting characters do not,
 * the bound holds, and sanitized copies are always acceptable and cut between characters.
 */
#include "common/util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

static void test_valid_strings_pass(void **state)
{
    (void)state;
    static const char *const good[] = {
        "",
        "allreduce-grads",
        "ring 0 / tp=8, pp=2",
        "\xc3\xa9t\xc3\xa9",                 /* été */
        "\xe8\xae\xad\xe7\xbb\x83",         /* 训练 */
        "\xf0\x9f\x9a\x80 launch",           /* U+1F680 */
        "\xef\xbf\xbd",                      /* U+FFFD itself is fine */
    };
    for (size_t i = 0; i < COLLD_ARRAY_SIZE(good); i++) {
        char why[128] = "";
        assert_true(colld_str_check(good[i], 63, why, sizeof(why)));
        assert_true(colld_str_valid(good[i], 63));
        assert_string_equal(why, "");
    }
}

static void expect_invalid(const char *s, size_t max, const char *why_part)
{
    char why[128] = "";
    assert_false(colld_str_check(s, max, why, sizeof(why)));
    assert_false(colld_str_valid(s, max));
    if (!strstr(why, why_part))
        fail_msg("'%s' does not contain '%s'", why, why_part);
}

static void test_invalid_strings_are_refused_with_the_reason(void **state)
{
    (void)state;
    expect_invalid("a\x1b[31mred", 63, "byte 1: control or formatting character U+001B");
    expect_invalid("line\nbreak", 63, "byte 4: control");
    expect_invalid("del\x7f", 63, "U+007F");
    expect_invalid("c1 \xc2\x9b", 63, "U+009B");                   /* C1 CSI */
    expect_invalid("rtl \xe2\x80\xae", 63, "U+202E");              /* right-to-left override */
    expect_invalid("iso \xe2\x81\xa6", 63, "U+2066");              /* left-to-right isolate */
    expect_invalid("sep \xe2\x80\xa8", 63, "U+2028");              /* line separator */
    expect_invalid("bad \xff", 63, "byte 4: not valid UTF-8 (0xff)");
    expect_invalid("\x80", 63, "byte 0: not valid UTF-8");          /* stray continuation */
    expect_invalid("\xc0\xaf", 63, "not valid UTF-8");              /* overlong '/' */
    expect_invalid("\xe0\x80\xaf", 63, "not valid UTF-8");          /* overlong, 3 bytes */
    expect_invalid("\xed\xa0\x80", 63, "not valid UTF-8");          /* surrogate U+D800 */
    expect_invalid("\xf4\x90\x80\x80", 63, "not valid UTF-8");      /* past U+10FFFF */
    expect_invalid("cut \xe8\xae", 63, "byte 4: not valid UTF-8");  /* truncated sequence */
    expect_invalid("0123456789", 9, "longer than 9 bytes");
    assert_true(colld_str_check("012345678", 9, NULL, 0)); /* exactly the bound; no reason wanted */
    assert_false(colld_str_check("\x01", 9, NULL, 0));
    assert_false(colld_str_valid(NULL, 9));
}

static void test_sanitize_replaces_and_cuts_between_characters(void **state)
{
    (void)state;
    char out[64];
    assert_false(colld_str_sanitize(out, sizeof(out), "ok\x1b[2Jx", SIZE_MAX));
    assert_string_equal(out, "ok?[2Jx");
    assert_false(colld_str_sanitize(out, sizeof(out), "a\xe2\x80\xae" "b", SIZE_MAX)); /* each byte a '?' */
    assert_string_equal(out, "a???b");
    colld_str_sanitize(out, sizeof(out), "\xff\xfe" "z", SIZE_MAX);
    assert_string_equal(out, "??z");
    assert_true(colld_str_sanitize(out, sizeof(out), "\xe8\xae\xad\xe7\xbb\x83", SIZE_MAX)); /* kept */
    assert_string_equal(out, "\xe8\xae\xad\xe7\xbb\x83");
    /* 5 bytes of room: the second 3-byte character does not fit and is left out whole. */
    char small[6];
    assert_false(colld_str_sanitize(small, sizeof(small), "\xe8\xae\xad\xe7\xbb\x83", SIZE_MAX));
    assert_string_equal(small, "\xe8\xae\xad");
    /* len bounds the input (a fixed-size field without a NUL); the bytes of a character it cuts
     * are each a '?'; a NUL ends the copy. */
    colld_str_sanitize(out, sizeof(out), "abc\xe8\xae\xad", 5);
    assert_string_equal(out, "abc??");
    assert_true(colld_str_sanitize(out, sizeof(out), "abc", 3));
    assert_false(colld_str_sanitize(out, sizeof(out), "ab\0cd", 5));
    assert_string_equal(out, "ab");
    assert_true(colld_str_sanitize(out, sizeof(out), NULL, SIZE_MAX));
    assert_string_equal(out, "");
    /* In place. */
    char inplace[] = "x\x07y\xe8\xae\xad";
    colld_str_sanitize(inplace, sizeof(inplace), inplace, SIZE_MAX);
    assert_string_equal(inplace, "x?y\xe8\xae\xad");
    /* Whatever goes in, what comes out is acceptable. */
    unsigned char junk[256];
    for (unsigned seed = 1; seed < 200; seed++) {
        for (size_t i = 0; i < sizeof(junk); i++)
            junk[i] = (unsigned char)((i * 131 + seed * 7919 + (i * seed) % 97) & 0xff);
        colld_str_sanitize(out, sizeof(out), (const char *)junk, sizeof(junk));
        assert_true(colld_str_valid(out, sizeof(out) - 1));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_strings_pass),
        cmocka_unit_test(test_invalid_strings_are_refused_with_the_reason),
        cmocka_unit_test(test_sanitize_replaces_and_cuts_between_characters),
    };
    return cmocka_run_group_tests_name("strings", tests, NULL, NULL);
}
