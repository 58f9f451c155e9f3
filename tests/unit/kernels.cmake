# kernels unit tests: CPU reduce kernels (every ISA build usable on the test machine vs scalar vs a
# reference), half-precision conversions.
colld_unit_test(test_kernels SOURCES test_kernels.c LIBS colld_kernels_cpu m TIMEOUT 120)
