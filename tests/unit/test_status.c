/*
 * test_status.c - status names and messages generated from COLLD_STATUS_LIST, and dtype sizes.
 */
#include <colld/colld.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

/* Every status code of the list, taken from the list itself so a new code is tested too. */
static const colld_status_t all_codes[] = {
#define TEST_STATUS_CODE_(name, value, text) COLLD_##name,
    COLLD_STATUS_LIST(TEST_STATUS_CODE_)
#undef TEST_STATUS_CODE_
};
static const char *const all_names[] = {
#define TEST_STATUS_NAME_(name, value, text) "COLLD_" #name,
    COLLD_STATUS_LIST(TEST_STATUS_NAME_)
#undef TEST_STATUS_NAME_
};
#define N_CODES (sizeof(all_codes) / sizeof(all_codes[0]))

/* Each code has the name of its list entry, starting with COLLD_, and no two names are equal. */
static void test_names_unique(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_CODES; i++) {
        const char *name = colld_status_name(all_codes[i]);
        assert_non_null(name);
        assert_int_equal(strncmp(name, "COLLD_", 6), 0);
        assert_string_equal(name, all_names[i]);
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(name, colld_status_name(all_codes[j]));
    }
}

/* Each code has a non-empty message, and no two codes share one. */
static void test_messages(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_CODES; i++) {
        const char *msg = colld_status_string(all_codes[i]);
        assert_non_null(msg);
        assert_true(strlen(msg) > 0);
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(msg, colld_status_string(all_codes[j]));
    }
    /* Codes are unique values too. */
    for (size_t i = 0; i < N_CODES; i++)
        for (size_t j = 0; j < i; j++)
            assert_int_not_equal(all_codes[i], all_codes[j]);
}

/* Values outside the list get the fallback name and a non-empty message. */
static void test_unknown(void **state)
{
    (void)state;
    const int unknown[] = {-1000, 2, 12345, INT32_MIN};
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        colld_status_t s = (colld_status_t)unknown[i];
        assert_string_equal(colld_status_name(s), "COLLD_ERR_UNKNOWN");
        assert_true(strlen(colld_status_string(s)) > 0);
    }
    assert_string_equal(colld_status_name(COLLD_OK), "COLLD_OK");
    assert_string_equal(colld_status_string(COLLD_OK), "success");
}

/* Element sizes of every dtype, and 0 for values that are not dtypes. */
static void test_dtype_size(void **state)
{
    (void)state;
    assert_int_equal(colld_dtype_size(COLLD_INT8), 1);
    assert_int_equal(colld_dtype_size(COLLD_UINT8), 1);
    assert_int_equal(colld_dtype_size(COLLD_INT32), 4);
    assert_int_equal(colld_dtype_size(COLLD_UINT32), 4);
    assert_int_equal(colld_dtype_size(COLLD_INT64), 8);
    assert_int_equal(colld_dtype_size(COLLD_UINT64), 8);
    assert_int_equal(colld_dtype_size(COLLD_FLOAT16), 2);
    assert_int_equal(colld_dtype_size(COLLD_BFLOAT16), 2);
    assert_int_equal(colld_dtype_size(COLLD_FLOAT32), 4);
    assert_int_equal(colld_dtype_size(COLLD_FLOAT64), 8);
    assert_int_equal(colld_dtype_size(COLLD_DTYPE_COUNT), 0);
    assert_int_equal(colld_dtype_size((colld_dtype_t)-1), 0);
    assert_int_equal(colld_dtype_size((colld_dtype_t)99), 0);
    for (int d = 0; d < COLLD_DTYPE_COUNT; d++)
        assert_true(colld_dtype_size((colld_dtype_t)d) > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_unique),
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_unknown),
        cmocka_unit_test(test_dtype_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
