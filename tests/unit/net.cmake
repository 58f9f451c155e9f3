# transport/tcp unit tests: real sockets on 127.0.0.1.
colld_unit_test(test_net SOURCES test_net.c LIBS colld_transport_tcp TIMEOUT 60)
