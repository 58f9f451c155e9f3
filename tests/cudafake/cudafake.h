/*
 * cudafake.h - what a test can ask of the CUDA driver test double (tests/cudafake) beyond the CUDA
 * driver API. The double is a test double of libcuda.so.1, for tests only; see README.md.
 *
 * These functions are exported by the double under names no real driver has. A test that loaded
 * the double finds them with dlsym (the typedefs below), never by linking: a test must keep
 * building and running (as a skip) where the double is absent.
 */
#ifndef COLLD_TESTS_CUDAFAKE_CUDAFAKE_H
#define COLLD_TESTS_CUDAFAKE_CUDAFAKE_H

#ifdef __cplusplus
extern "C" {
#endif

/* Apply fault specifications now, in this process (the grammar of COLLD_CUDAFAKE_FAULTS, fault.c
 * and README.md: fail:, sticky:, stall:, release:, clear, and poll, which reads the control file
 * now). Returns 0, or -1 when one is malformed (the
 * others are applied; the reason goes to stderr). */
int colld_cudafake_control(const char *specs);
typedef int (*colld_cudafake_control_fn)(const char *specs);

/* How many times this process called an entry point (a base name, "cuMemAlloc"), failed calls
 * included; 0 for a name the double does not know. */
unsigned long long colld_cudafake_calls(const char *entry);
typedef unsigned long long (*colld_cudafake_calls_fn)(const char *entry);

/* The number a fault specification names a stream by ("stall:N"): its creation number in the
 * process, 1-based; 0 for something that is not a live stream (the legacy stream is "L<device>"). */
unsigned long long colld_cudafake_stream_id(void *stream);
typedef unsigned long long (*colld_cudafake_stream_id_fn)(void *stream);

/* The environment the double reads (README.md has the details). */
#define COLLD_CUDAFAKE_ENV_DEVICES "COLLD_CUDAFAKE_DEVICES"
#define COLLD_CUDAFAKE_ENV_DRIVER_VERSION "COLLD_CUDAFAKE_DRIVER_VERSION"
#define COLLD_CUDAFAKE_ENV_FAULTS "COLLD_CUDAFAKE_FAULTS"
#define COLLD_CUDAFAKE_ENV_CONTROL "COLLD_CUDAFAKE_CONTROL"
#define COLLD_CUDAFAKE_ENV_ARENA "COLLD_CUDAFAKE_ARENA"

#ifdef __cplusplus
}
#endif

#endif /* COLLD_TESTS_CUDAFAKE_CUDAFAKE_H */
