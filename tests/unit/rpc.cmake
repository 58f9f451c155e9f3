# rpc unit tests: a real server and a real client of the gRPC wrappers, in-process, over a unix
# socket. The test-only proto is compiled by protoc-c at build time (never committed) and built
# without the project warnings.
set(RPC_TEST_PROTO ${CMAKE_CURRENT_SOURCE_DIR}/rpc_test.proto)
set(RPC_TEST_PB ${CMAKE_CURRENT_BINARY_DIR}/rpc_test.pb-c.c ${CMAKE_CURRENT_BINARY_DIR}/rpc_test.pb-c.h)
add_custom_command(
  OUTPUT ${RPC_TEST_PB}
  COMMAND ${PROTOC_C} --proto_path=${CMAKE_CURRENT_SOURCE_DIR} --c_out=${CMAKE_CURRENT_BINARY_DIR} ${RPC_TEST_PROTO}
  DEPENDS ${RPC_TEST_PROTO}
  COMMENT "protoc-c rpc_test.proto")
add_library(colld_rpc_test_proto STATIC ${CMAKE_CURRENT_BINARY_DIR}/rpc_test.pb-c.c)
target_include_directories(colld_rpc_test_proto PUBLIC ${CMAKE_CURRENT_BINARY_DIR})
target_link_libraries(colld_rpc_test_proto PUBLIC PkgConfig::PROTOBUFC)

colld_unit_test(test_rpc SOURCES test_rpc.c
  LIBS colld_rpc_server colld_rpc_client colld_rpc_test_proto Threads::Threads
  TIMEOUT 120)
