# common unit tests: status strings, logging, configuration tables.
colld_unit_test(test_status SOURCES test_status.c LIBS colld_common TIMEOUT 30)
colld_unit_test(test_log SOURCES test_log.c LIBS colld_common TIMEOUT 30)
colld_unit_test(test_config SOURCES test_config.c LIBS colld_common TIMEOUT 30)
colld_unit_test(test_log_journal SOURCES test_log_journal.c LIBS colld_common TIMEOUT 30)
colld_unit_test(test_strings SOURCES test_strings.c LIBS colld_common TIMEOUT 30)
colld_unit_test(test_linkhealth SOURCES test_linkhealth.c LIBS colld_common TIMEOUT 30)
# The CUDA driver table's explicit types (issue 15 A2): a compile-time check.
if(COLLD_HAVE_CUDA)
  colld_unit_test(test_cudadrv_abi SOURCES test_cudadrv_abi.c LIBS colld_common TIMEOUT 30)
endif()
