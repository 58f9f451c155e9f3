/*
 * nccl_gpu_rank.c - colld-test-nccl-gpu-rank: one rank of the NCCL API test on device buffers
 * (test_nccl.c, group `gpu`): a program written against nccl.h and the CUDA driver API (the tests'
 * own loader, tests/gpu/gpu_cu.h: no CUDA runtime), linked with colld's libnccl.so.2, run on the
 * CUDA driver test double (--cudafake: the libcuda.so.1 it finds must be the double).
 *
 * Rank 0 makes the unique id (ncclGetUniqueId) and hands it over in --id-file; every rank joins
 * (ncclCommInitRank), puts its buffers on GPU rank % --gpus (cuMemAlloc) and, on its own stream:
 *   - for several data types, one group with an ncclSend to and an ncclRecv from every rank (itself
 *     included; an all-to-all as nccl-tests' alltoall makes it), the inputs copied to the device
 *     and the results back on the stream, one host wait at the end;
 *   - PyTorch's pattern without groups: each rank in turn sends to every other in rank order, the
 *     others receive, everything on the stream;
 *   - a pipeline (rank r receives from r - 1, sends to r + 1) whose senders call ncclCommDestroy
 *     at once, without waiting for their streams: the last rank still gets the data;
 * every element compared exactly. Device buffers are stream-ordered as with NCCL: the calls return
 * at once and the stream waits.
 *
 * Exit status: 0 everything exact; 1 a wrong result or an error (printed); 2 bad arguments.
 */
#include "nccl.h"
#include "nccl_share_id.h" /* the tests' own: the unique id through a file */
#include "tests/gpu/gpu_cu.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define MAXN 8
#define COUNT 4099

static int nranks = 2, rank = 0, gpus = 1;
static const char *id_file;
static gpu_cu_t cu;

#define CHECK(call)                                                                                                    \
    do {                                                                                                               \
        ncclResult_t r_ = (call);                                                                                      \
        if (r_ != ncclSuccess) {                                                                                       \
            fprintf(stderr, "rank %d: %s: %s (%d): %s\n", rank, #call, ncclGetErrorString(r_), (int)r_,                \
                    ncclGetLastError(NULL));                                                                           \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

#define CU(call)                                                                                                       \
    do {                                                                                                               \
        CUresult e_ = (call);                                                                                          \
        char why_[256];                                                                                                \
        if (e_ != CUDA_SUCCESS) {                                                                                      \
            fprintf(stderr, "rank %d: %s: %s\n", rank, #call, gpu_cu_describe(&cu, e_, why_, sizeof(why_)));           \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

/* The byte j of the message from rank `from` to rank `to` in round `salt`: any data type's bytes
 * are moved unchanged, so bytes are enough to check every type exactly. */
static unsigned char byte_of(int from, int to, unsigned salt, size_t j)
{
    return (unsigned char)((size_t)from * 131u + (size_t)to * 31u + salt * 7u + j * 13u + (j >> 8));
}

static size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    default:
        return 8;
    }
}

/* A gate on a stream: a page of host memory the stream waits on (cuStreamWaitValue32) until a
 * thread opens it, late: the work queued after it on the stream waits that long. */
typedef struct {
    volatile uint32_t *word;
    int delay_ms;
} gate_t;

static void *gate_opener(void *arg)
{
    gate_t *g = arg;
    struct timespec ts = { g->delay_ms / 1000, (long)(g->delay_ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
    __atomic_store_n(g->word, 1u, __ATOMIC_RELEASE);
    return NULL;
}

/* Compare `bytes` received from `from` in round `salt`; the count of wrong bytes (printed). */
static long check(const unsigned char *got, int from, unsigned salt, size_t bytes, const char *what)
{
    for (size_t j = 0; j < bytes; j++)
        if (got[j] != byte_of(from, rank, salt, j)) {
            fprintf(stderr, "rank %d: %s from rank %d: byte %zu of %zu is %u, want %u\n", rank, what, from, j, bytes,
                    got[j], byte_of(from, rank, salt, j));
            return 1;
        }
    return 0;
}

int main(int argc, char **argv)
{
    bool cudafake = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--cudafake") == 0)
            cudafake = true;
        else if (i + 1 < argc && strcmp(argv[i], "--nranks") == 0)
            nranks = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--rank") == 0)
            rank = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--id-file") == 0)
            id_file = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--gpus") == 0)
            gpus = atoi(argv[++i]);
        else {
            fprintf(stderr, "unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (nranks < 1 || nranks > MAXN || rank < 0 || rank >= nranks || !id_file || gpus < 1) {
        fprintf(stderr, "usage: %s --nranks N (1..%d) --rank R --id-file PATH [--gpus N] [--cudafake]\n", argv[0],
                MAXN);
        return 2;
    }
    char err[512];
    if (gpu_cu_load(&cu, cudafake, err, sizeof(err)) != GPU_CU_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 1;
    }
    CU(gpu_cu_use_device(&cu, rank % gpus));
    CUstream stream;
    CU(cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    ncclUniqueId id;
    ncclComm_t comm;
    nccl_test_share_id(&id, rank, id_file);
    CHECK(ncclCommInitRank(&comm, nranks, id, rank));
    size_t region = (size_t)MAXN * COUNT * 8;
    CUdeviceptr ds, dr;
    CU(cu.cuMemAlloc(&ds, region));
    CU(cu.cuMemAlloc(&dr, region));
    unsigned char *hs = gpu_cu_host_alloc(&cu, region, err, sizeof(err));
    unsigned char *hr = hs ? gpu_cu_host_alloc(&cu, region, err, sizeof(err)) : NULL;
    if (!hr) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 1;
    }
    long bad = 0, checked = 0;
    const ncclDataType_t types[] = { ncclInt8, ncclFloat16, ncclFloat32, ncclFloat64 };
    for (unsigned t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        size_t bytes = COUNT * type_size(types[t]);
        for (int q = 0; q < nranks; q++)
            for (size_t j = 0; j < bytes; j++)
                hs[(size_t)q * bytes + j] = byte_of(rank, q, t, j);
        memset(hr, 0x5a, (size_t)nranks * bytes);
        CU(cu.cuMemcpyHtoDAsync(ds, hs, (size_t)nranks * bytes, stream));
        CU(cu.cuMemcpyHtoDAsync(dr, hr, (size_t)nranks * bytes, stream));
        CHECK(ncclGroupStart());
        for (int q = 0; q < nranks; q++) {
            CHECK(ncclSend((void *)(uintptr_t)(ds + (size_t)q * bytes), COUNT, types[t], q, comm, stream));
            CHECK(ncclRecv((void *)(uintptr_t)(dr + (size_t)q * bytes), COUNT, types[t], q, comm, stream));
        }
        CHECK(ncclGroupEnd());
        CU(cu.cuMemcpyDtoHAsync(hr, dr, (size_t)nranks * bytes, stream));
        CU(cu.cuStreamSynchronize(stream));
        for (int q = 0; q < nranks; q++, checked++)
            bad += check(hr + (size_t)q * bytes, q, t, bytes, "ncclSend/ncclRecv all-to-all");
    }
    /* Without groups, in rank order (PyTorch's test_send_recv), all on the stream. */
    unsigned salt = 99;
    size_t bytes = COUNT * 4;
    for (int q = 0; q < nranks; q++)
        for (size_t j = 0; j < bytes; j++)
            hs[(size_t)q * bytes + j] = byte_of(rank, q, salt, j);
    CU(cu.cuMemcpyHtoDAsync(ds, hs, (size_t)nranks * bytes, stream));
    for (int src = 0; src < nranks; src++)
        for (int dst = 0; dst < nranks; dst++) {
            if (src == dst || (rank != src && rank != dst))
                continue;
            if (rank == src)
                CHECK(ncclSend((void *)(uintptr_t)(ds + (size_t)dst * bytes), COUNT, ncclInt32, dst, comm, stream));
            else
                CHECK(ncclRecv((void *)(uintptr_t)(dr + (size_t)src * bytes), COUNT, ncclInt32, src, comm, stream));
        }
    CU(cu.cuMemcpyDtoHAsync(hr, dr, (size_t)nranks * bytes, stream));
    CU(cu.cuStreamSynchronize(stream));
    for (int q = 0; q < nranks; q++)
        if (q != rank) {
            bad += check(hr + (size_t)q * bytes, q, salt, bytes, "ncclSend/ncclRecv in rank order");
            checked++;
        }
    ncclResult_t async = ncclSuccess;
    CHECK(ncclCommGetAsyncError(comm, &async));
    if (async != ncclSuccess) {
        fprintf(stderr, "rank %d: ncclCommGetAsyncError: %s\n", rank, ncclGetErrorString(async));
        bad++;
    }
    /* Every rank has checked before any leaves. */
    CHECK(ncclAllReduce(hs, hs, 1, ncclInt32, ncclSum, comm, NULL));
    /* A pipeline that ends in ncclCommDestroy (vLLM's stages, test_pynccl's pipeline): rank r > 0
     * receives from r - 1; rank r < n - 1 sends to r + 1 and destroys its communicator at once,
     * without waiting for its stream. NCCL's ncclCommDestroy finalizes first, and so must colld's:
     * the send still arrives (on an H200, test_pynccl's last rank got zeros before the fix). The
     * sender's stream is held at a gate until 300 ms after the call, so that the send is not
     * there yet when ncclCommDestroy is called. */
    salt = 7;
    for (size_t j = 0; j < bytes; j++)
        hs[j] = byte_of(rank, rank + 1, salt, j);
    memset(hr, 0x5a, bytes);
    CU(cu.cuMemcpyHtoDAsync(ds, hs, bytes, stream));
    CU(cu.cuMemcpyHtoDAsync(dr, hr, bytes, stream));
    if (rank > 0)
        CHECK(ncclRecv((void *)(uintptr_t)dr, COUNT, ncclInt32, rank - 1, comm, stream));
    /* The sender's stream reaches its send only 300 ms after ncclCommDestroy was called. */
    uint32_t *word = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (word == MAP_FAILED) {
        fprintf(stderr, "rank %d: mmap failed\n", rank);
        return 1;
    }
    CU(cu.cuMemHostRegister(word, 4096, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
    CUdeviceptr dword;
    CU(cu.cuMemHostGetDevicePointer(&dword, word, 0));
    gate_t gate = { .word = word, .delay_ms = 300 };
    pthread_t opener;
    bool opening = false;
    if (rank < nranks - 1) {
        CU(cu.cuStreamWaitValue32(stream, dword, 1, CU_STREAM_WAIT_VALUE_GEQ));
        CHECK(ncclSend((void *)(uintptr_t)ds, COUNT, ncclInt32, rank + 1, comm, stream));
        opening = pthread_create(&opener, NULL, gate_opener, &gate) == 0;
        if (!opening)
            *word = 1;
    }
    if (rank == nranks - 1 && rank > 0) {
        CU(cu.cuMemcpyDtoHAsync(hr, dr, bytes, stream));
        CU(cu.cuStreamSynchronize(stream));
        bad += check(hr, rank - 1, salt, bytes, "a pipeline whose sender destroys its communicator at once");
        checked++;
        CHECK(ncclCommGetAsyncError(comm, &async));
        if (async != ncclSuccess) {
            fprintf(stderr, "rank %d: after the pipeline: ncclCommGetAsyncError: %s (%s)\n", rank,
                    ncclGetErrorString(async), ncclGetLastError(comm));
            bad++;
        }
    }
    CHECK(ncclCommDestroy(comm));
    if (opening)
        pthread_join(opener, NULL);
    CU(cu.cuStreamSynchronize(stream)); /* released: nothing of it waits for ever */
    CU(cu.cuMemHostUnregister(word));
    munmap(word, 4096);
    printf("rank %d: %ld device-buffer messages checked, %ld wrong\n", rank, checked, bad);
    gpu_cu_host_free(&cu, hs, region);
    gpu_cu_host_free(&cu, hr, region);
    CU(cu.cuMemFree(ds));
    CU(cu.cuMemFree(dr));
    CU(cu.cuStreamDestroy(stream));
    return bad ? 1 : 0;
}
