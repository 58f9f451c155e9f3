# transport/tcp unit tests: real sockets on 127.0.0.1.
colld_unit_test(test_net SOURCES test_net.c LIBS colld_transport_tcp TIMEOUT 60)
# The --peers list of server/net/allow.c (which root daemons a tenant's unique id may name).
colld_unit_test(test_peer_allow SOURCES test_peer_allow.c ${PROJECT_SOURCE_DIR}/server/net/allow.c
                LIBS colld_transport_tcp colld_common)
# transport/ib without RDMA hardware: a peer's IB offer checked, opening without verbs (docs/ib.md).
colld_unit_test(test_ib SOURCES test_ib.c LIBS colld_transport_ib TIMEOUT 30)
if(COLLD_HAVE_IB)
  target_compile_definitions(test_ib PRIVATE COLLD_HAVE_IB=1)
endif()
