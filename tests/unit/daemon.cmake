# The daemon core in-process (tests/fuzz/core_fixture.h: sessions with in-memory rings, the real
# registry and engine, a round at a time): admission of every descriptor field, matching, mismatch
# reports, time-outs naming ranks, the fast-area judgement, the communicator state machine,
# point-to-point operations; and the inter-node algorithms' block arithmetic on a collective object
# of their own.
colld_unit_test(test_core_admit SOURCES test_core_admit.c LIBS colld_core_fixture TIMEOUT 60)
colld_unit_test(test_core_match SOURCES test_core_match.c LIBS colld_core_fixture TIMEOUT 60)
colld_unit_test(test_core_premul SOURCES test_core_premul.c LIBS colld_core_fixture TIMEOUT 60)
colld_unit_test(test_core_fast SOURCES test_core_fast.c LIBS colld_core_fixture TIMEOUT 60)
colld_unit_test(test_core_comm SOURCES test_core_comm.c LIBS colld_core_fixture TIMEOUT 60)
colld_unit_test(test_core_deadlock SOURCES test_core_deadlock.c LIBS colld_core_fixture TIMEOUT 60)
colld_unit_test(test_net_algo SOURCES test_net_algo.c LIBS colld_core TIMEOUT 30)
colld_unit_test(test_core_p2p SOURCES test_core_p2p.c LIBS colld_core_fixture TIMEOUT 60)
# Result verification's checksums and verdicts (issue 30 item 3).
colld_unit_test(test_core_verify SOURCES test_core_verify.c LIBS colld_core TIMEOUT 30)
