/*
 * nccl.h - the NCCL 2.19 C API, as colld's libnccl.so.2 implements it (bindings/nccl/nccl.c), and
 * the calls of NCCL 2.20-2.28 that PyTorch 2.x links (ncclAlltoAll, ncclCommInitRankScalable,
 * ncclCommShrink, ncclGroupSimulateEnd, memory windows, device communicators).
 *
 * A program written against NCCL builds against this header and runs through colld by loading
 * colld's libnccl.so.2 instead of NVIDIA's (LD_LIBRARY_PATH=<prefix>/lib/colld, or LD_PRELOAD of
 * it where the program has an RPATH to NVIDIA's, as PyTorch's wheels do: docs/nccl.md). Names,
 * types and values are NCCL's, so a program built against NVIDIA's nccl.h of 2.19 or later also
 * runs unchanged (ncclConfig_t is read only as far as its `size` says). ncclGetVersion reports
 * 2.19.3 (NCCL_VERSION_CODE below).
 *
 * What differs from NVIDIA's library (docs/nccl.md):
 *   - Host memory is accepted (a colld extension): a collective whose buffers are both host memory
 *     runs on the daemon's host backend and has completed when the call returns (inside
 *     ncclGroupStart/End: when ncclGroupEnd returns); its stream argument is ignored. Device
 *     buffers are stream-ordered, as with NCCL.
 *   - ncclSend / ncclRecv on device buffers are stream-ordered, as with NCCL; on host buffers a
 *     send or receive has completed when the call (or ncclGroupEnd) returns, so two ranks that
 *     send to each other must group their sends and receives, as with NCCL. A group's sends and
 *     receives on one communicator are all on device buffers or all on host buffers.
 *   - ncclRedOpCreatePreMulSum takes the scalar in host memory (ncclScalarHostImmediate) only; a
 *     scalar in device memory (ncclScalarDevice) fails with ncclInvalidUsage. The scalar is of
 *     `datatype` (a float16 or bfloat16 scalar is that 16-bit value, as NCCL); float16 and bfloat16
 *     products and sums are computed in float and rounded once.
 *   - Not yet implemented, failing with ncclInvalidUsage and a message from ncclGetLastError:
 *     non-blocking communicators (config->blocking = 0), ncclCommSplit inside a group.
 *   - ncclCommRegister registers a device buffer's allocation(s) with the daemon up front
 *     (colld_mem_register) until ncclCommDeregister or ncclCommDestroy; a host buffer not from
 *     ncclMemAlloc cannot be registered (its collectives are staged): the call succeeds and
 *     registers nothing. Unregistered buffers are registered at their first use, as before.
 *   - ncclCommInitRankScalable joins with commIds[0] (every rank passes the same ids in the same
 *     order, so the first is common to all; the others are not needed).
 *   - ncclCommShrink: the ranks that stay call it (as with NCCL); the new communicator's unique id
 *     passes from its rank 0 to the others over the parent's sends and receives (one each), so the
 *     parent must still run them: the excluded ranks may be idle or have destroyed their handles,
 *     but after a rank died or an abort (a broken communicator) it fails; NCCL_SHRINK_ABORT is
 *     refused (ncclInvalidUsage). Not inside a group.
 *   - ncclGroupSimulateEnd ends the group without starting any of its collectives (the
 *     communicators stay as they were; deferred inits do run) and fails with ncclInvalidUsage:
 *     colld has no cost model to estimate their time.
 *   - Memory windows (ncclCommWindowRegister) and device communicators (ncclDevCommCreate) are
 *     refused with ncclInvalidUsage: both let the application's kernels reach the peers' memory,
 *     and colld's collectives run in the daemon.
 */
#ifndef COLLD_NCCL_H
#define COLLD_NCCL_H

#include <limits.h>
#include <stddef.h>

/* As NVIDIA's nccl.h: where the CUDA toolkit's headers are on the include path, the CUDA runtime's
 * types come with this header (cudaStream_t, and the half types that NCCL programs such as
 * nccl-tests take from it); elsewhere no CUDA header is needed and a cudaStream_t is the pointer
 * below. Only headers: nothing of the CUDA runtime is linked. */
#if defined(__has_include)
#if __has_include(<cuda_runtime.h>) && __has_include(<cuda_fp16.h>)
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#if defined(CUDART_VERSION) && CUDART_VERSION >= 11000 && __has_include(<cuda_bf16.h>)
#include <cuda_bf16.h>
#endif
#define NCCL_STREAM_T_DEFINED
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define NCCL_MAJOR 2
#define NCCL_MINOR 19
#define NCCL_PATCH 3
#define NCCL_SUFFIX "colld"
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

#ifndef NCCL_STREAM_T_DEFINED
#define NCCL_STREAM_T_DEFINED
typedef struct CUstream_st *cudaStream_t;
#endif

typedef struct ncclComm *ncclComm_t;
#define NCCL_COMM_NULL NULL
/* A memory window (NCCL 2.27): colld makes none (ncclCommWindowRegister is refused). */
typedef struct ncclWindow_vidmem *ncclWindow_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

/* ncclCommWindowRegister's flags and alignment (NCCL's values). */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* ncclCommShrink's flags: shrink as the parent stands, or abort the parent's operations first
 * (NCCL_SHRINK_ABORT, refused by colld). */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/* Communicator configuration (NCCL 2.19's fields). Start from NCCL_CONFIG_INITIALIZER. */
typedef struct ncclConfig_v21700 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                                                        \
    {                                                                                                                  \
        sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_CONFIG_UNDEF_INT,     \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR,                \
            NCCL_CONFIG_UNDEF_INT                                                                                      \
    }

/* What ncclGroupSimulateEnd reports (NCCL 2.22's fields). Start from NCCL_SIM_INFO_INITIALIZER. */
typedef struct ncclSimInfo_v22200 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    float estimatedTime; /* microseconds */
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER                                                                                      \
    {                                                                                                                  \
        sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_UNDEF_FLOAT          \
    }

typedef enum {
    ncclSum = 0,
    ncclProd = 1,
    ncclMax = 2,
    ncclMin = 3,
    ncclAvg = 4,
    ncclNumOps = 5,
    ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

typedef enum {
    ncclInt8 = 0,
    ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclHalf = 6,
    ncclFloat32 = 7,
    ncclFloat = 7,
    ncclFloat64 = 8,
    ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclNumTypes = 10
} ncclDataType_t;

typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

/* Version, errors */
ncclResult_t ncclGetVersion(int *version);
const char *ncclGetErrorString(ncclResult_t result);
/* What the last failed call said: of `comm`, or with comm NULL of this thread's last call. */
const char *ncclGetLastError(ncclComm_t comm);

/* Communicators */
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config);
ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist);
/* nId unique ids (1..nranks), the same on every rank: colld joins with commIds[0]. */
ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId, ncclUniqueId *commIds,
                                      ncclConfig_t *config);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config);
/* The ranks of comm not in excludeRanksList (they alone call it) form *newcomm, in their order in
 * comm. shrinkFlags: NCCL_SHRINK_DEFAULT (NCCL_SHRINK_ABORT is refused). */
ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm,
                            ncclConfig_t *config, int shrinkFlags);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle);
/* Refused (ncclInvalidUsage): colld has no memory windows. Deregistering NULL does nothing. */
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);

/* Device communicators (NCCL 2.28's device API, whose types NVIDIA's nccl_device.h defines):
 * refused (ncclInvalidUsage); colld has none to destroy (ncclInvalidArgument). */
typedef struct ncclDevComm ncclDevComm_t;
typedef struct ncclDevCommRequirements ncclDevCommRequirements_t;
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const ncclDevCommRequirements_t *reqs, ncclDevComm_t *outDevComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const ncclDevComm_t *devComm);

/* Memory */
ncclResult_t ncclMemAlloc(void **ptr, size_t size);
ncclResult_t ncclMemFree(void *ptr);

/* Reduction operators */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* Collectives */
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
/* Block j of sendbuff (count elements each) goes to rank j, which receives it at block `rank` of
 * its recvbuff; the two buffers must not overlap. */
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,
                          cudaStream_t stream);

/* Point to point */
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);

/* Groups */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
/* Ends the group as ncclGroupEnd does, but starts none of its collectives (sends, receives);
 * colld has no estimate of their time: the outermost level fails with ncclInvalidUsage. */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo);

#ifdef __cplusplus
}
#endif

#endif /* COLLD_NCCL_H */
