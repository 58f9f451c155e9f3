/*
 * test_peer_allow.c - the --peers list (server/net/allow.c): what parses, what is refused, and
 * which root addresses a list lets the daemon dial.
 */
#include "server/net/allow.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

static colld_peer_allow_t *parse_ok(const char *text)
{
    colld_peer_allow_t *a = NULL;
    char err[256] = "";
    if (colld_peer_allow_parse(text, &a, err, sizeof(err)) < 0)
        fail_msg("'%s' refused: %s", text, err);
    return a;
}

static void test_empty_matches_nothing(void **state)
{
    (void)state;
    colld_peer_allow_t *a = parse_ok(NULL);
    assert_int_equal(colld_peer_allow_count(a), 0);
    assert_false(colld_peer_allow_match(a, "10.0.0.1:7070"));
    colld_peer_allow_free(a);
    a = parse_ok(" , ");
    assert_int_equal(colld_peer_allow_count(a), 0);
    colld_peer_allow_free(a);
    assert_false(colld_peer_allow_match(NULL, "10.0.0.1:7070"));
}

static void test_entries(void **state)
{
    (void)state;
    colld_peer_allow_t *a = parse_ok("10.1.0.0/16:7070, node-7.example:7071,[fd00::/64]:*, 192.168.1.5:*");
    assert_int_equal(colld_peer_allow_count(a), 4);
    assert_true(colld_peer_allow_match(a, "10.1.255.3:7070"));
    assert_false(colld_peer_allow_match(a, "10.1.255.3:22"));     /* another port */
    assert_false(colld_peer_allow_match(a, "10.2.0.1:7070"));     /* outside the network */
    assert_true(colld_peer_allow_match(a, "NODE-7.example:7071")); /* names compare without case */
    assert_false(colld_peer_allow_match(a, "node-7.example:7070"));
    assert_false(colld_peer_allow_match(a, "node-8.example:7071"));
    assert_true(colld_peer_allow_match(a, "[fd00::1:2]:9"));
    assert_false(colld_peer_allow_match(a, "[fd01::1]:9"));
    assert_true(colld_peer_allow_match(a, "192.168.1.5:1"));
    assert_false(colld_peer_allow_match(a, "192.168.1.6:1"));
    assert_false(colld_peer_allow_match(a, "192.168.1.5:0")); /* not an address to dial */
    assert_false(colld_peer_allow_match(a, "192.168.1.5"));
    colld_peer_allow_free(a);
    /* a name never matches an address, nor an address a name: names are not resolved */
    a = parse_ok("localhost:7070,0.0.0.0/0:7070");
    assert_true(colld_peer_allow_match(a, "localhost:7070"));
    assert_true(colld_peer_allow_match(a, "127.0.0.1:7070"));
    assert_false(colld_peer_allow_match(a, "example.com:7071"));
    assert_false(colld_peer_allow_match(a, "[::1]:7070")); /* another family */
    colld_peer_allow_free(a);
    a = parse_ok("*:7070,10.0.0.0/31:*");
    assert_true(colld_peer_allow_match(a, "anything.example:7070"));
    assert_true(colld_peer_allow_match(a, "10.0.0.1:5"));
    assert_false(colld_peer_allow_match(a, "10.0.0.2:5"));
    colld_peer_allow_free(a);
}

static void test_refused(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "10.0.0.1",          /* no port */
        "10.0.0.1:0",        /* port 0 */
        "10.0.0.1:65536",    /* too large */
        "10.0.0.1:http",     /* not a number */
        "10.0.0.0/33:7070",  /* prefix */
        "10.0.0.0/:7070",    /* empty prefix */
        "name/8:7070",       /* a network of a name */
        "bad host:7070",     /* a space */
        "::1:7070",          /* IPv6 without brackets */
        "[fd00::1:7070",     /* no closing bracket */
        ":7070",             /* no host */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        colld_peer_allow_t *a = NULL;
        char err[256] = "";
        assert_int_equal(colld_peer_allow_parse(bad[i], &a, err, sizeof(err)), -1);
        assert_null(a);
        assert_non_null(strstr(err, "--peers"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_matches_nothing),
        cmocka_unit_test(test_entries),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests_name("peer_allow", tests, NULL, NULL);
}
