/*
 * test_linkhealth.c - the slow-link rule (common/linkhealth.h): which links it names, the minimum
 * number of measured siblings, unmeasured links, ties, and the text operators read.
 */
#include "common/linkhealth.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#define MB 1e6

static void test_one_link_at_a_tenth_is_named(void **state)
{
    (void)state;
    colld_link_rate_t l[4] = { { .rate = 110 * MB }, { .rate = 11 * MB }, { .rate = 118 * MB }, { .rate = 114 * MB } };
    assert_int_equal(colld_link_outliers(l, 4), 1);
    assert_false(l[0].slow);
    assert_true(l[1].slow);
    assert_false(l[2].slow);
    assert_false(l[3].slow);
    assert_true(l[1].others_median == 114 * MB);
    assert_true(l[1].others_min == 110 * MB);
    assert_true(l[1].others_max == 118 * MB);
    char text[128];
    colld_link_describe(text, sizeof(text), "host0", "host2", &l[1]);
    assert_string_equal(text, "host0 \u2192 host2: 11 MB/s, other links 110\u2013118 MB/s");
}

static void test_the_boundary_is_a_quarter_of_the_median_of_the_others(void **state)
{
    (void)state;
    /* others: 100 and 120, median 110: 27.5 is the boundary */
    colld_link_rate_t at[3] = { { .rate = 100 * MB }, { .rate = 120 * MB }, { .rate = 27.5 * MB } };
    assert_int_equal(colld_link_outliers(at, 3), 0);
    colld_link_rate_t below[3] = { { .rate = 100 * MB }, { .rate = 120 * MB }, { .rate = 27.4 * MB } };
    assert_int_equal(colld_link_outliers(below, 3), 1);
    assert_true(below[2].slow);
    /* a link at half its siblings' speed is not named */
    colld_link_rate_t half[3] = { { .rate = 100 * MB }, { .rate = 100 * MB }, { .rate = 50 * MB } };
    assert_int_equal(colld_link_outliers(half, 3), 0);
}

static void test_too_few_measured_links_name_nothing(void **state)
{
    (void)state;
    colld_link_rate_t two[2] = { { .rate = 100 * MB }, { .rate = 1 * MB } };
    assert_int_equal(colld_link_outliers(two, 2), 0);
    assert_false(two[1].slow);
    /* unmeasured links (rate 0) take no part: still only two measured */
    colld_link_rate_t gaps[4] = { { .rate = 100 * MB }, { .rate = 0 }, { .rate = 1 * MB }, { .rate = -1 } };
    assert_int_equal(colld_link_outliers(gaps, 4), 0);
    assert_true(gaps[0].others_median == 0);
    assert_int_equal(colld_link_outliers(NULL, 0), 0);
}

static void test_two_slow_links_among_many_are_both_named(void **state)
{
    (void)state;
    colld_link_rate_t l[6] = { { .rate = 100 * MB }, { .rate = 2 * MB }, { .rate = 105 * MB },
                               { .rate = 0 },        { .rate = 3 * MB }, { .rate = 98 * MB } };
    assert_int_equal(colld_link_outliers(l, 6), 2);
    assert_true(l[1].slow);
    assert_true(l[4].slow);
    assert_false(l[3].slow); /* not measured: never slow */
    /* l[1]'s others: 3, 98, 100, 105: median 99 */
    assert_true(l[1].others_median == 99 * MB);
    char text[128];
    colld_link_describe(text, sizeof(text), "a", "b", &l[1]);
    assert_string_equal(text, "a \u2192 b: 2.0 MB/s, other links 3.0 MB/s to 105 MB/s");
}

static void test_equal_links_are_never_slow(void **state)
{
    (void)state;
    colld_link_rate_t l[5] = {
        { .rate = 7 * MB }, { .rate = 7 * MB }, { .rate = 7 * MB }, { .rate = 7 * MB }, { .rate = 7 * MB }
    };
    assert_int_equal(colld_link_outliers(l, 5), 0);
    assert_true(l[2].others_median == 7 * MB);
    char text[32];
    colld_link_rate_text(text, sizeof(text), 0);
    assert_string_equal(text, "-");
    colld_link_rate_text(text, sizeof(text), 620000);
    assert_string_equal(text, "0.62 MB/s");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_link_at_a_tenth_is_named),
        cmocka_unit_test(test_the_boundary_is_a_quarter_of_the_median_of_the_others),
        cmocka_unit_test(test_too_few_measured_links_name_nothing),
        cmocka_unit_test(test_two_slow_links_among_many_are_both_named),
        cmocka_unit_test(test_equal_links_are_never_slow),
    };
    return cmocka_run_group_tests_name("linkhealth", tests, NULL, NULL);
}
