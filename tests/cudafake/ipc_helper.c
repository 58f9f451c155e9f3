/*
 * ipc_helper.c - the other process of test_cudafake's cross-process cases (colld-cudafake-helper).
 *
 * It loads the CUDA driver test double the way colld does (common/cudadrv.c: dlopen
 * "libcuda.so.1", found through LD_LIBRARY_PATH, then cuGetProcAddress), does one thing and prints
 * one line: "ok ..." or what went wrong. Modes:
 *   loader                       colld_cu_load(): "ok <driver version>" or "fail <reason>"
 *   devices                      "<count>" then "<name>" per device
 *   ipc <handle hex> <pattern> <flag offset>
 *                                open the legacy IPC handle (twice: the same address), check that
 *                                its first 4 KiB hold `pattern`, set them to pattern + 1, then on a
 *                                stream write 7 at the flag offset and wait for the next word to
 *                                reach 9 (GEQ): the exporter's side of a cross-process flag protocol
 *   ipc-open <handle hex>        open the handle, print the CUresult name
 *   vmm <fd> <size> <pattern>    import the VMM allocation behind the inherited fd, map it, check
 *                                its first 4 KiB hold `pattern`, set them to pattern + 1
 *   vmm-import <fd>              import, print the CUresult name
 */
#include "common/cudadrv.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK_BYTES 4096

static const colld_cu_t *cu;

static const char *name_of(CUresult r)
{
    const char *n = NULL;
    cu->cuGetErrorName(r, &n);
    return n ? n : "?";
}

/* Print a failure of `what` and exit. */
static int fail(const char *what, CUresult r)
{
    printf("fail %s %s\n", what, name_of(r));
    fflush(stdout);
    exit(0);
}

#define TRY(call)                                                                                            \
    do {                                                                                                     \
        CUresult r_ = (call);                                                                                \
        if (r_ != CUDA_SUCCESS)                                                                              \
            fail(#call, r_);                                                                                 \
    } while (0)

static void use_device0(void)
{
    CUcontext ctx;
    TRY(cu->cuDevicePrimaryCtxRetain(&ctx, 0));
    TRY(cu->cuCtxSetCurrent(ctx));
}

static bool parse_handle(const char *hex, CUipcMemHandle *h)
{
    if (strlen(hex) != 2 * sizeof(h->reserved))
        return false;
    for (size_t i = 0; i < sizeof(h->reserved); i++) {
        unsigned b;
        if (sscanf(hex + 2 * i, "%2x", &b) != 1)
            return false;
        h->reserved[i] = (char)b;
    }
    return true;
}

/* Are the first CHECK_BYTES bytes at p all `pattern`? */
static bool holds(CUdeviceptr p, int pattern)
{
    unsigned char buf[CHECK_BYTES];
    TRY(cu->cuMemcpyDtoH(buf, p, sizeof(buf)));
    for (size_t i = 0; i < sizeof(buf); i++)
        if (buf[i] != (unsigned char)pattern)
            return false;
    return true;
}

static int mode_ipc(const char *hex, int pattern, size_t flag_off)
{
    CUipcMemHandle h;
    if (!parse_handle(hex, &h))
        return printf("fail bad handle\n"), 0;
    use_device0();
    CUdeviceptr p, again;
    TRY(cu->cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    TRY(cu->cuIpcOpenMemHandle(&again, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    if (again != p)
        return printf("fail second open gave another address\n"), 0;
    CUdeviceptr base = 0;
    size_t size = 0;
    TRY(cu->cuMemGetAddressRange(&base, &size, p + 1));
    if (base != p)
        return printf("fail address range base\n"), 0;
    if (!holds(p, pattern))
        return printf("fail the memory does not hold the exporter's pattern\n"), 0;
    TRY(cu->cuMemsetD8(p, (unsigned char)(pattern + 1), CHECK_BYTES));
    CUstream s;
    TRY(cu->cuStreamCreate(&s, 0)); /* blocking: ordered after the memset on the legacy stream */
    TRY(cu->cuStreamWriteValue32(s, p + flag_off, 7, CU_STREAM_WRITE_VALUE_DEFAULT));
    TRY(cu->cuStreamWaitValue32(s, p + flag_off + 4, 9, CU_STREAM_WAIT_VALUE_GEQ));
    TRY(cu->cuStreamSynchronize(s));
    TRY(cu->cuStreamDestroy(s));
    TRY(cu->cuIpcCloseMemHandle(p));
    TRY(cu->cuIpcCloseMemHandle(p));
    CUresult r = cu->cuIpcCloseMemHandle(p);
    printf("ok %s\n", name_of(r)); /* a third close: the mapping is gone */
    return 0;
}

static int mode_vmm(int fd, size_t size, int pattern)
{
    use_device0();
    CUmemGenericAllocationHandle h;
    TRY(cu->cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    TRY(cu->cuMemGetAllocationPropertiesFromHandle(&prop, h));
    size_t gran;
    TRY(cu->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUdeviceptr p;
    TRY(cu->cuMemAddressReserve(&p, size, gran, 0, 0));
    TRY(cu->cuMemMap(p, size, 0, h, 0));
    TRY(cu->cuMemRelease(h)); /* the mapping holds the memory */
    CUmemAccessDesc acc = { .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 },
                            .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    TRY(cu->cuMemSetAccess(p, size, &acc, 1));
    if (!holds(p, pattern))
        return printf("fail the memory does not hold the exporter's pattern\n"), 0;
    TRY(cu->cuMemsetD8(p, (unsigned char)(pattern + 1), CHECK_BYTES));
    TRY(cu->cuCtxSynchronize());
    TRY(cu->cuMemUnmap(p, size));
    TRY(cu->cuMemAddressFree(p, size));
    printf("ok\n");
    return 0;
}

/* Is the libcuda.so.1 found here the test double (it alone exports colld_cudafake_control)?
 * Asked before colld's loader calls cuInit, so that a real driver is never driven by this test. */
static bool on_double(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    bool yes = lib && dlsym(lib, "colld_cudafake_control");
    if (lib)
        dlclose(lib);
    return yes || !lib;
}

int main(int argc, char **argv)
{
    char err[256];
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!on_double()) {
        printf("fail libcuda.so.1 is not the CUDA driver test double\n");
        return 0;
    }
    cu = colld_cu_load(err, sizeof(err));
    if (argc >= 2 && strcmp(argv[1], "loader") == 0) {
        if (cu)
            printf("ok %d\n", cu->driver_version);
        else
            printf("fail %s\n", err);
        return 0;
    }
    if (!cu) {
        printf("fail %s\n", err);
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "devices") == 0) {
        int n = 0;
        TRY(cu->cuDeviceGetCount(&n));
        printf("%d\n", n);
        for (int i = 0; i < n; i++) {
            char name[256];
            TRY(cu->cuDeviceGetName(name, (int)sizeof(name), i));
            printf("%s\n", name);
        }
        return 0;
    }
    if (argc == 5 && strcmp(argv[1], "ipc") == 0)
        return mode_ipc(argv[2], atoi(argv[3]), (size_t)strtoul(argv[4], NULL, 0));
    if (argc == 3 && strcmp(argv[1], "ipc-open") == 0) {
        CUipcMemHandle h;
        CUdeviceptr p;
        if (!parse_handle(argv[2], &h))
            return printf("fail bad handle\n"), 0;
        use_device0();
        printf("%s\n", name_of(cu->cuIpcOpenMemHandle(&p, h, 0)));
        return 0;
    }
    if (argc == 5 && strcmp(argv[1], "vmm") == 0)
        return mode_vmm(atoi(argv[2]), (size_t)strtoull(argv[3], NULL, 0), atoi(argv[4]));
    if (argc == 3 && strcmp(argv[1], "vmm-import") == 0) {
        CUmemGenericAllocationHandle h;
        use_device0();
        printf("%s\n", name_of(cu->cuMemImportFromShareableHandle(&h, (void *)(intptr_t)atoi(argv[2]),
                                                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)));
        return 0;
    }
    fprintf(stderr, "usage: colld-cudafake-helper loader|devices|ipc|ipc-open|vmm|vmm-import ...\n");
    return 2;
}
