# Unit tests of the shared-memory ring and doorbell.
colld_unit_test(test_ring SOURCES test_ring.c LIBS colld_common Threads::Threads TIMEOUT 30)
