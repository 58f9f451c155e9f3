/*
 * test_ib.c - transport/ib without RDMA hardware: the checks of a peer's IB offer (what
 * server/net/iblink.c refuses before any verbs call), and colld_ib_open failing with a reason on a
 * machine without verbs (ENOSYS or no device). What needs a device (queue pairs, writes, credits)
 * runs only where one exists: tests/softroce (docs/ib.md).
 */
#include "transport/ib/ib.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <string.h>

#define PAYLOAD (1u << 20)

#if COLLD_HAVE_IB
static colld_ib_endpoint_t good(void)
{
    colld_ib_endpoint_t e = { .qpn = 0x11,
                              .psn = 0x123456,
                              .lid = 0,
                              .mtu = 3,
                              .ring_addr = 0x7f0000001000ull,
                              .ring_rkey = 0x1234,
                              .slots = IB_SLOTS,
                              .slot_payload = PAYLOAD };
    e.gid[10] = e.gid[11] = 0xff;
    e.gid[12] = 10;
    e.gid[15] = 2;
    return e;
}

static void expect_refused(const colld_ib_endpoint_t *e, const char *words)
{
    char err[160] = "";
    assert_int_equal(colld_ib_endpoint_check(e, PAYLOAD, err, sizeof(err)), -1);
    if (!strstr(err, words))
        fail_msg("reason '%s' does not say '%s'", err, words);
}

static void test_offer_checks(void **state)
{
    (void)state;
    char err[160] = "";
    colld_ib_endpoint_t e = good();
    assert_int_equal(colld_ib_endpoint_check(&e, PAYLOAD, err, sizeof(err)), 0);
    e.mtu = 0;
    expect_refused(&e, "MTU code 0");
    e = good();
    e.mtu = 77;
    expect_refused(&e, "MTU code 77");
    e = good();
    e.qpn = 0;
    expect_refused(&e, "QP number 0");
    e = good();
    e.qpn = 0x1000000;
    expect_refused(&e, "out of range");
    e = good();
    e.psn = 0xffffffff;
    expect_refused(&e, "out of range");
    e = good();
    e.slots = 1000;
    expect_refused(&e, "ring of 1000 slots");
    e = good();
    e.slot_payload = 1u << 30;
    expect_refused(&e, "this daemon uses");
    e = good();
    e.ring_rkey = 0;
    expect_refused(&e, "no receive ring");
    e = good();
    memset(e.gid, 0, sizeof(e.gid));
    expect_refused(&e, "neither a GID nor a LID");
}
#endif

/* Where there is no usable RDMA port, opening says why (this CI host: ENOSYS). */
static void test_open_without_device(void **state)
{
    (void)state;
    char err[256] = "";
    colld_ib_t *ib = NULL;
    if (colld_ib_open(NULL, 0, &ib, err, sizeof(err)) == 0) {
        colld_ib_close(ib);
        skip(); /* a machine with an active RDMA port */
    }
    assert_null(ib);
    assert_true(strstr(err, "ENOSYS") || strstr(err, "no RDMA device") || strstr(err, "without libibverbs"));
    assert_int_equal(colld_ib_open("no-such-device0", 0, &ib, err, sizeof(err)), -1);
    assert_null(ib);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#if COLLD_HAVE_IB
        cmocka_unit_test(test_offer_checks),
#endif
        cmocka_unit_test(test_open_without_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
