/*
 * test_core_verify.c - result verification's verdicts (server/core/verify.c): which result is the
 * reference (the majority's, else the lowest index's), how many differ, the first differing
 * element, and the test hook's syntax.
 */
#include "server/core/verify.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

static void test_all_equal(void **state)
{
    (void)state;
    uint64_t s[4] = { 7, 7, 7, 7 };
    int ref = -1;
    bool maj = false;
    assert_int_equal(colld_verify_verdict(s, 4, &ref, &maj), 0);
    assert_int_equal(ref, 0);
    assert_true(maj);
}

/* One of three differs: the majority is the reference, even when the odd one is index 0. */
static void test_majority(void **state)
{
    (void)state;
    uint64_t s[3] = { 9, 7, 7 };
    int ref = -1;
    bool maj = false;
    assert_int_equal(colld_verify_verdict(s, 3, &ref, &maj), 1);
    assert_int_equal(ref, 1);
    assert_true(maj);
    uint64_t t[5] = { 1, 2, 1, 3, 1 };
    assert_int_equal(colld_verify_verdict(t, 5, &ref, &maj), 2);
    assert_int_equal(ref, 0);
    assert_true(maj);
}

/* Two that differ (or a tie): no majority, index 0 is the reference. */
static void test_no_majority(void **state)
{
    (void)state;
    uint64_t s[2] = { 5, 6 };
    int ref = -1;
    bool maj = true;
    assert_int_equal(colld_verify_verdict(s, 2, &ref, &maj), 1);
    assert_int_equal(ref, 0);
    assert_false(maj);
    uint64_t t[4] = { 5, 6, 6, 5 };
    assert_int_equal(colld_verify_verdict(t, 4, &ref, &maj), 2);
    assert_int_equal(ref, 0);
    assert_false(maj);
}

static void test_sum_and_first_diff(void **state)
{
    (void)state;
    static float a[10000], b[10000];
    for (int i = 0; i < 10000; i++)
        a[i] = b[i] = (float)i;
    assert_true(colld_verify_sum(a, sizeof(a)) == colld_verify_sum(b, sizeof(b)));
    assert_int_equal(colld_verify_first_diff(a, b, 10000, sizeof(float)), 10000);
    ((unsigned char *)&b[7000])[0] ^= 1;
    assert_true(colld_verify_sum(a, sizeof(a)) != colld_verify_sum(b, sizeof(b)));
    assert_int_equal(colld_verify_first_diff(a, b, 10000, sizeof(float)), 7000);
}

static void test_hook_parse(void **state)
{
    (void)state;
    int r;
    uint64_t e;
    assert_true(colld_verify_hook_parse(NULL, &r, &e));
    assert_int_equal(r, -2);
    assert_true(colld_verify_hook_parse("1:7000", &r, &e));
    assert_int_equal(r, 1);
    assert_int_equal(e, 7000);
    assert_true(colld_verify_hook_parse("node:400000", &r, &e));
    assert_int_equal(r, -1);
    assert_int_equal(e, 400000);
    assert_false(colld_verify_hook_parse("x:1", &r, &e));
    assert_false(colld_verify_hook_parse("1:", &r, &e));
    assert_false(colld_verify_hook_parse("1:2x", &r, &e));
    assert_false(colld_verify_hook_parse("-1:2", &r, &e));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_equal),   cmocka_unit_test(test_majority),
        cmocka_unit_test(test_no_majority), cmocka_unit_test(test_sum_and_first_diff),
        cmocka_unit_test(test_hook_parse),
    };
    return cmocka_run_group_tests_name("verify", tests, NULL, NULL);
}
