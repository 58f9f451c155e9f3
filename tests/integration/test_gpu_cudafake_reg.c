/*
 * test_gpu_cudafake_reg.c - GPU registrations: the device a registration names is checked by the
 * daemon (issue 15 C5, group vmm/legacy), a buffer the application freed leaves the daemon (C1/D4,
 * group defects), a buffer across several VMM allocations of one reservation and the hostile
 * segments of such a registration (D2, group defects), colld_mem_register / colld_mem_deregister
 * (group vmm/legacy). See harness_gpu.h.
 */
#include "tests/integration/harness_gpu.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The name of the double's VMM memfds of GPU `dev` ("cudafake-vmm:<uuid hex>"). */
static void vmm_name(int dev, char *name, size_t len)
{
    CUuuid u;
    CUdevice d;
    char hex[33];
    CU_MUST(cu->cuDeviceGet(&d, dev));
    CU_MUST(cu->cuDeviceGetUuid(&u, d));
    for (int b = 0; b < 16; b++)
        snprintf(hex + 2 * b, 3, "%02x", (unsigned char)u.bytes[b]);
    snprintf(name, len, "cudafake-vmm:%s", hex);
}

/* Wait (at most WAIT_MS) until the daemon maps no memfd named `name` (its releases run on a
 * thread of their own, issue 15 F4). */
static bool daemon_unmaps(pid_t pid, const char *name)
{
    for (int i = 0; i < WAIT_MS / 5; i++) {
        if (!daemon_maps(pid, name))
            return true;
        harness_wait_file("/nonexistent", 5);
    }
    return false;
}

/* ============================================================================================
 * The device a registration names (issue 15 C5)
 * ========================================================================================== */

/* Issue 15 C5: a GPU registration names its device by UUID, and the daemon used to take the
 * client's word for it. Now it asks its driver where the memory it mapped lives: a buffer on GPU 0
 * registered as GPU 1's (a legacy IPC handle, and a VMM fd where the devices have VMM) is refused
 * with COLLD_ERR_INVALID_ARGUMENT naming both GPUs; the same buffer with its own UUID is accepted.
 * Raw REG_CUDA messages, as a lying client sends them (client/client_internal.h). */
static colld_status_t register_raw(harness_t *h, unsigned how, const void *ipc, int fd, size_t bytes,
                                   const CUuuid *uuid, char *detail, size_t len)
{
    colld_wire_msg_t m, reply;
    memset(&m, 0, sizeof(m));
    memset(&reply, 0, sizeof(reply));
    m.type = COLLD_MSG_REG_CUDA;
    m.u.reg_cuda.how = how;
    m.u.reg_cuda.bytes = bytes;
    m.u.reg_cuda.cookie = 42;
    memcpy(m.u.reg_cuda.uuid, uuid->bytes, sizeof(m.u.reg_cuda.uuid));
    if (ipc)
        memcpy(m.u.reg_cuda.ipc, ipc, sizeof(m.u.reg_cuda.ipc));
    colld_status_t st = colld__sock_request(h->client, &m, fd, COLLD_MSG_REG_REPLY, &reply, NULL, 0);
    if (st != COLLD_OK)
        return st;
    reply.u.detail[sizeof(reply.u.detail) - 1] = '\0';
    snprintf(detail, len, "%s", reply.status == COLLD_OK ? "" : reply.u.detail);
    return (colld_status_t)reply.status;
}

static void test_registration_device_checked(void **state)
{
    harness_t *h = *state;
    CUcontext ctx;
    CUdevice dev[2];
    CUuuid uuid[2];
    char detail[600];
    for (int i = 0; i < 2; i++) {
        CU_MUST(cu->cuDeviceGet(&dev[i], i));
        CU_MUST(cu->cuDeviceGetUuid(&uuid[i], dev[i]));
    }
    CU_MUST(cu->cuDevicePrimaryCtxRetain(&ctx, 0));
    CU_MUST(cu->cuCtxSetCurrent(ctx));
    /* Legacy IPC: cuMemAlloc memory of GPU 0. */
    CUdeviceptr buf = 0;
    CUipcMemHandle ih;
    CU_MUST(cu->cuMemAlloc(&buf, 1 << 20));
    CU_MUST(cu->cuIpcGetMemHandle(&ih, buf));
    colld_status_t st = register_raw(h, COLLD_CUDA_EXPORT_IPC, ih.reserved, -1, 1 << 20, &uuid[1], detail,
                                     sizeof(detail));
    print_message("IPC handle of GPU 0 memory named as GPU 1's: %s: %s\n", colld_status_name(st), detail);
    assert_int_equal(st, COLLD_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(detail, "the registration names GPU 1"));
    assert_non_null(strstr(detail, "but the buffer is on GPU 0"));
    assert_int_equal(register_raw(h, COLLD_CUDA_EXPORT_IPC, ih.reserved, -1, 1 << 20, &uuid[0], detail, sizeof(detail)),
                     COLLD_OK);
    /* VMM: a POSIX fd of GPU 0 memory, where the device has VMM. */
    int vmm = 0;
    CU_MUST(cu->cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev[0]));
    if (vmm) {
        CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                     .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 } };
        size_t gran = 0;
        CUmemGenericAllocationHandle mh = 0;
        CU_MUST(cu->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        CU_MUST(cu->cuMemCreate(&mh, gran, &prop, 0));
        for (int i = 1; i >= 0; i--) { /* the lie, then the truth */
            int fd = -1;
            CU_MUST(cu->cuMemExportToShareableHandle(&fd, mh, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
            st = register_raw(h, COLLD_CUDA_EXPORT_FD, NULL, fd, gran, &uuid[i], detail, sizeof(detail));
            close(fd);
            print_message("VMM fd of GPU 0 memory named as GPU %d's: %s: %s\n", i, colld_status_name(st), detail);
            if (i == 1) {
                assert_int_equal(st, COLLD_ERR_INVALID_ARGUMENT);
                assert_non_null(strstr(detail, "but the buffer is on GPU 0"));
            } else {
                assert_int_equal(st, COLLD_OK);
            }
        }
        CU_MUST(cu->cuMemRelease(mh));
    }
    assert_true(daemon_on_double(h->pid, true));
    CU_MUST(cu->cuMemFree(buf));
    cu->cuCtxSetCurrent(NULL);
    cu->cuDevicePrimaryCtxRelease(0);
}

/* ============================================================================================
 * Freed buffers (issue 15 C1/D4)
 * ========================================================================================== */

/* C1/D4: an implicitly registered buffer stayed mapped in the daemon after the application freed it
 * while its client stayed connected: a legacy IPC mapping of freed memory (undefined behaviour with
 * the driver), a VMM mapping that kept the GPU memory. Now libcolld drops a cached registration
 * whose allocation is gone (client/cuda.c sweep_freed: checked a few per post, all at a new
 * registration and at a communicator's destruction) and the daemon closes its mapping. Each rank
 * runs an all-reduce on a buffer, frees it, and destroys its communicator. */
static int defect_vmm; /* sc_freed: register VMM memory instead of cuMemAlloc memory */

static void sc_freed(rank_t *r)
{
    CUdeviceptr buf = 0, va = 0;
    CUmemGenericAllocationHandle h = 0;
    size_t gran = 0, bytes = COUNT * sizeof(float);
    if (defect_vmm) {
        CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                     .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = r->rank } };
        CUmemAccessDesc acc = { .location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        if (cu->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ||
            cu->cuMemCreate(&h, gran, &prop, 0) || cu->cuMemAddressReserve(&va, gran, 0, 0, 0) ||
            cu->cuMemMap(va, gran, 0, h, 0) || cu->cuMemSetAccess(va, gran, &acc, 1))
            return rank_fail(r, "VMM buffer");
        buf = va;
    } else if (cu->cuMemAlloc(&buf, bytes) != CUDA_SUCCESS) {
        return rank_fail(r, "cuMemAlloc");
    }
    r->st[0] = colld_allreduce((void *)buf, (void *)buf, COUNT, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    r->cr[0] = cu->cuStreamSynchronize(r->s);
    r->st[1] = colld_comm_synchronize(r->comm); /* ran: the daemon has the buffer registered */
    CUpointer_attribute at = CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID;
    unsigned long long block = 0;
    void *data = &block;
    cu->cuPointerGetAttributes(1, &at, &data, buf);
    r->v[0] = (long)block;
    if (defect_vmm) {
        r->cr[1] = cu->cuMemUnmap(va, gran);
        cu->cuMemAddressFree(va, gran);
        cu->cuMemRelease(h); /* the application has let go of every reference */
    } else {
        r->cr[1] = cu->cuMemFree(buf);
    }
}

static void test_freed_buffer_unmapped(void **state)
{
    harness_t *h = *state;
    for (defect_vmm = 0; defect_vmm <= 1; defect_vmm++) {
        rank_t ranks[2];
        run_ranks(h, sc_freed, 0, ranks);
        for (int i = 0; i < 2; i++) {
            assert_int_equal(ranks[i].st[0], COLLD_OK);
            assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS);
            assert_int_equal(ranks[i].st[1], COLLD_OK);
            assert_int_equal(ranks[i].cr[1], CUDA_SUCCESS);
        }
        /* Rank 0's client is still connected, but its communicator's destruction dropped the
         * registration of the buffer it freed (client/cuda_reg.c sweep_freed): the daemon's
         * mapping went with it. Rank 1 disconnected: its session's registrations went with it too. */
        char name[128];
        for (int i = 0; i < 2; i++) {
            if (defect_vmm)
                vmm_name(i, name, sizeof(name));
            else
                snprintf(name, sizeof(name), "cudafake-alloc:%d:%ld ", (int)getpid(), ranks[i].v[0]);
            assert_true(daemon_unmaps(h->pid, name)); /* its releases run on a thread of their own */
        }
    }
}

/* ============================================================================================
 * Buffers across several VMM allocations (issue 15 D2)
 * ========================================================================================== */

#define SEGS 3 /* VMM allocations mapped back to back in one reservation */

/* SEGS allocations of `gran` bytes of the rank's GPU, mapped back to back in one reservation
 * (as PyTorch's expandable segments grow one), readable and writable by the rank's GPU. */
typedef struct {
    CUdeviceptr va;
    size_t gran;
    CUmemGenericAllocationHandle h[SEGS];
    int made;
} segs_t;

static bool segs_make(rank_t *r, segs_t *sg)
{
    CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                 .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                 .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = rank_device[r->rank] } };
    CUmemAccessDesc acc = { .location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    memset(sg, 0, sizeof(*sg));
    if (cu->cuMemGetAllocationGranularity(&sg->gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ||
        cu->cuMemAddressReserve(&sg->va, SEGS * sg->gran, 0, 0, 0)) {
        rank_fail(r, "a VMM reservation");
        return false;
    }
    for (; sg->made < SEGS; sg->made++) {
        CUdeviceptr at = sg->va + (CUdeviceptr)sg->made * sg->gran;
        if (cu->cuMemCreate(&sg->h[sg->made], sg->gran, &prop, 0))
            break;
        if (cu->cuMemMap(at, sg->gran, 0, sg->h[sg->made], 0) || cu->cuMemSetAccess(at, sg->gran, &acc, 1)) {
            cu->cuMemRelease(sg->h[sg->made]);
            break;
        }
    }
    if (sg->made < SEGS)
        rank_fail(r, "VMM allocation %d of %d", sg->made, SEGS);
    return sg->made == SEGS;
}

static void segs_free(segs_t *sg)
{
    for (int i = 0; i < sg->made; i++) {
        cu->cuMemUnmap(sg->va + (CUdeviceptr)i * sg->gran, sg->gran);
        cu->cuMemRelease(sg->h[i]); /* the application lets go of every reference */
    }
    if (sg->va)
        cu->cuMemAddressFree(sg->va, SEGS * sg->gran);
}

/* D2, fixed: an in-place all-reduce of 2048 floats across the seam of allocations 0 and 1, then an
 * out-of-place one from a buffer across all three (the last 4 KiB of 0, all of 1, the first 4 KiB of
 * 2) into cuMemAlloc memory, each result exact. Then the buffers are freed. */
static void sc_multisegment(rank_t *r)
{
    static float host[2][(4u << 20) / sizeof(float) + 4096];
    float *h = host[r->rank];
    segs_t sg;
    CUdeviceptr out = 0;
    if (!segs_make(r, &sg))
        goto out;
    /* 8 KiB over the seam of allocations 0 and 1. */
    CUdeviceptr seam = sg.va + sg.gran - 4096;
    size_t n = 2048;
    if (!fill(r, seam, seam, n, 0, h) ||
        !finished(r, "all-reduce across 2 VMM allocations",
                  colld_allreduce((void *)seam, (void *)seam, n, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s)) ||
        !expect_values(r, "all-reduce across 2 VMM allocations", seam, n, h, want_sum))
        goto out;
    /* From the end of allocation 0, all of 1, into the start of 2: across three. */
    CUdeviceptr three = sg.va + sg.gran - 4096;
    n = (sg.gran + 8192) / sizeof(float);
    if (n > sizeof(host[0]) / sizeof(float) || cu->cuMemAlloc(&out, n * sizeof(float)) != CUDA_SUCCESS) {
        rank_fail(r, "the output buffer");
        goto out;
    }
    if (!fill(r, three, out, n, n, h) ||
        !finished(r, "all-reduce across 3 VMM allocations",
                  colld_allreduce((void *)three, (void *)out, n, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s)) ||
        !expect_values(r, "all-reduce across 3 VMM allocations", out, n, h, want_sum))
        goto out;
out:
    snprintf(r->detail, sizeof(r->detail), "%s", colld_comm_last_error(r->comm));
    pthread_barrier_wait(r->barrier); /* the daemon's kernels read both ranks' buffers */
    if (out)
        cu->cuMemFree(out);
    segs_free(&sg);
}

/* Issue 15 D2, fixed: a buffer across several VMM allocations mapped back to back in one
 * reservation (PyTorch's expandable segments) was refused (COLLD_ERR_INVALID_ARGUMENT, "runs past
 * the end of its GPU buffer": the client registered the one mapping that held the pointer). Now the
 * client registers every allocation the buffer spans as the segments of one registration
 * (COLLD_MSG_REG_CUDA_SEG) and the daemon maps them back to back: two all-reduces, across two and
 * three allocations, rank r on GPU r, are exact. Once both ranks freed the memory and destroyed the
 * communicator, the daemon maps no VMM memory of either GPU any more (its segments unmapped one by
 * one). Before the fix the first all-reduce failed (this case's open-defect version asserted it). */
static void test_multisegment_vmm_buffer(void **state)
{
    harness_t *h = *state;
    rank_t ranks[2];
    run_ranks(h, sc_multisegment, 0, ranks);
    for (int i = 0; i < 2; i++)
        assert_int_equal(ranks[i].v[0], 2); /* both all-reduces exact */
    char name[64];
    for (int d = 0; d < 2; d++) {
        vmm_name(d, name, sizeof(name));
        assert_true(daemon_unmaps(h->pid, name));
    }
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

/* How many descriptors of the double's VMM memory (an imported allocation holds one) the daemon has
 * open. */
static int daemon_vmm_fds(pid_t pid)
{
    char dir[64], path[384], target[512];
    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    DIR *dp = opendir(dir);
    int n = 0;
    for (struct dirent *de; dp && (de = readdir(dp));) {
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        ssize_t len = readlink(path, target, sizeof(target) - 1);
        if (len > 0) {
            target[len] = '\0';
            n += strstr(target, "cudafake-vmm:") != NULL;
        }
    }
    if (dp)
        closedir(dp);
    return n;
}

/* One REG_CUDA_SEG message, as a hostile client may send it; COLLD_OK with *reg_id, or the
 * daemon's status with its detail. */
static colld_status_t seg_raw(colld_client_t *c, int fd, uint64_t cookie, unsigned index, unsigned count,
                              uint64_t offset, uint64_t bytes, uint64_t total, const CUuuid *uuid, uint32_t *reg_id,
                              char *detail, size_t len)
{
    colld_wire_msg_t m, reply;
    memset(&m, 0, sizeof(m));
    memset(&reply, 0, sizeof(reply));
    m.type = COLLD_MSG_REG_CUDA_SEG;
    m.u.reg_cuda_seg = (__typeof__(m.u.reg_cuda_seg)){
        .total = total, .cookie = cookie, .offset = offset, .bytes = bytes, .index = index, .count = count
    };
    memcpy(m.u.reg_cuda_seg.uuid, uuid->bytes, sizeof(m.u.reg_cuda_seg.uuid));
    colld_status_t st = colld__sock_request(c, &m, fd, COLLD_MSG_REG_REPLY, &reply, NULL, 0);
    if (st != COLLD_OK)
        return st;
    reply.u.detail[sizeof(reply.u.detail) - 1] = '\0';
    snprintf(detail, len, "%s", reply.status == COLLD_OK ? "" : reply.u.detail);
    if (reg_id)
        *reg_id = reply.status == COLLD_OK ? reply.u.reg_reply.reg_id : 0;
    return (colld_status_t)reply.status;
}

/* A segment that must be refused with INVALID_ARGUMENT and a detail containing `what`. */
#define SEG_REFUSED(what, ...)                                                                                         \
    do {                                                                                                               \
        colld_status_t st_ = seg_raw(__VA_ARGS__, NULL, detail, sizeof(detail));                                       \
        print_message("%s: %s\n", colld_status_name(st_), detail);                                                     \
        assert_int_equal(st_, COLLD_ERR_INVALID_ARGUMENT);                                                             \
        assert_non_null(strstr(detail, what));                                                                         \
    } while (0)

/* The daemon takes every field of a segment as the client's word: hostile segments are refused
 * with COLLD_ERR_INVALID_ARGUMENT naming what is wrong, each failure drops the assembly (a later
 * segment of it is "not being assembled"), and nothing stays half-registered: afterwards the
 * daemon holds no imported allocation. The tenant is charged at the first segment: with
 * --max-regs-per-tenant 2, an assembly under way counts, a third first segment is refused with
 * COLLD_ERR_QUOTA_EXCEEDED before anything is imported, and the charge goes back when the assembling
 * client disconnects. After all the refusals, two registrations still fit (no charge leaked). */
static void test_segments_hostile(void **state)
{
    harness_t *h = *state;
    CUcontext ctx;
    CUdevice dev[2];
    CUuuid uuid[2];
    for (int i = 0; i < 2; i++) {
        CU_MUST(cu->cuDeviceGet(&dev[i], i));
        CU_MUST(cu->cuDeviceGetUuid(&uuid[i], dev[i]));
    }
    CU_MUST(cu->cuDevicePrimaryCtxRetain(&ctx, 0));
    CU_MUST(cu->cuCtxSetCurrent(ctx));
    rank_t r0 = { .rank = 0 };
    segs_t sg;
    assert_true(segs_make(&r0, &sg));
    size_t g = sg.gran;
    int fd[SEGS];
    for (int i = 0; i < SEGS; i++)
        CU_MUST(cu->cuMemExportToShareableHandle(&fd[i], sg.h[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    colld_client_t *c = h->client;
    char detail[COLLD_WIRE_DETAIL_BYTES + 8];
    uint32_t id = 0;
    SEG_REFUSED("not being assembled", c, fd[1], 7, 1, 2, g, g, 2 * g, &uuid[0]);
    SEG_REFUSED("colld takes 2 to 256", c, fd[0], 7, 0, 1, 0, g, g, &uuid[0]);
    SEG_REFUSED("colld takes 2 to 256", c, fd[0], 7, 0, 257, 0, g, 257 * g, &uuid[0]);
    SEG_REFUSED("without a file descriptor", c, -1, 7, 0, 2, 0, g, 2 * g, &uuid[0]);
    SEG_REFUSED("out of range", c, fd[0], 7, 0, 2, 0, 0, 2 * g, &uuid[0]);
    /* Out of order: segment 2 after 0; the assembly is gone, so segment 1 finds none. */
    assert_int_equal(seg_raw(c, fd[0], 7, 0, 3, 0, g, 3 * g, &uuid[0], &id, detail, sizeof(detail)), COLLD_OK);
    assert_int_equal(id, 0);
    SEG_REFUSED("out of order", c, fd[2], 7, 2, 3, 2 * g, g, 3 * g, &uuid[0]);
    SEG_REFUSED("not being assembled", c, fd[1], 7, 1, 3, g, g, 3 * g, &uuid[0]);
    /* Another registration's segment, a wrong offset, a total the segments do not fill. */
    assert_int_equal(seg_raw(c, fd[0], 7, 0, 2, 0, g, 2 * g, &uuid[0], &id, detail, sizeof(detail)), COLLD_OK);
    SEG_REFUSED("does not belong", c, fd[1], 8, 1, 2, g, g, 2 * g, &uuid[0]);
    assert_int_equal(seg_raw(c, fd[0], 7, 0, 2, 0, g, 2 * g, &uuid[0], &id, detail, sizeof(detail)), COLLD_OK);
    SEG_REFUSED("does not follow", c, fd[1], 7, 1, 2, 0, g, 2 * g, &uuid[0]);
    assert_int_equal(seg_raw(c, fd[0], 7, 0, 2, 0, g, 3 * g, &uuid[0], &id, detail, sizeof(detail)), COLLD_OK);
    SEG_REFUSED("add up to", c, fd[1], 7, 1, 2, g, g, 3 * g, &uuid[0]);
    /* GPU 0 memory named as GPU 1's (issue 15 C5, for every segment). */
    SEG_REFUSED("is on device 0, but the registration names GPU 1", c, fd[0], 7, 0, 2, 0, g, 2 * g, &uuid[1]);
    /* A segment larger than its allocation: cuMemMap refuses it. */
    assert_int_equal(seg_raw(c, fd[0], 7, 0, 2, 0, 2 * g, 4 * g, &uuid[0], &id, detail, sizeof(detail)), COLLD_OK);
    SEG_REFUSED("cannot map", c, fd[1], 7, 1, 2, 2 * g, 2 * g, 4 * g, &uuid[0]);
    /* A new first segment drops the assembly under way (its import included). */
    assert_int_equal(seg_raw(c, fd[0], 7, 0, 3, 0, g, 3 * g, &uuid[0], &id, detail, sizeof(detail)), COLLD_OK);
    assert_int_equal(seg_raw(c, fd[1], 9, 0, 2, 0, g, 2 * g, &uuid[0], &id, detail, sizeof(detail)), COLLD_OK);
    SEG_REFUSED("does not belong", c, fd[1], 7, 1, 3, g, g, 3 * g, &uuid[0]);
    /* Nothing half-registered: no imported allocation is left in the daemon. */
    assert_int_equal(daemon_vmm_fds(h->pid), 0);

    /* The charge at the first segment: another client's assembly under way counts for the tenant. */
    colld_client_t *c2 = NULL;
    assert_int_equal(colld_connect(h->socket, &c2), COLLD_OK);
    assert_int_equal(seg_raw(c2, fd[2], 5, 0, 2, 0, g, 2 * g, &uuid[0], &id, detail, sizeof(detail)), COLLD_OK);
    uint32_t first = 0;
    assert_int_equal(seg_raw(c, fd[0], 7, 0, 2, 0, g, 2 * g, &uuid[0], &id, detail, sizeof(detail)), COLLD_OK);
    assert_int_equal(seg_raw(c, fd[1], 7, 1, 2, g, g, 2 * g, &uuid[0], &first, detail, sizeof(detail)), COLLD_OK);
    assert_true(first != 0);
    /* c's first segment over the quota is refused. */
    colld_status_t st = seg_raw(c, fd[1], 6, 0, 2, 0, g, 2 * g, &uuid[0], &id, detail, sizeof(detail));
    print_message("%s: %s\n", colld_status_name(st), detail);
    assert_int_equal(st, COLLD_ERR_QUOTA_EXCEEDED);
    /* c2's new first segment, over the tenant's bytes, is refused and drops the charge of its
     * assembly under way, whose next segment must then be refused rather than make an uncharged
     * registration. */
    assert_int_equal(seg_raw(c2, fd[1], 4, 0, 2, 0, g, 1ull << 60, &uuid[0], &id, detail, sizeof(detail)),
                     COLLD_ERR_QUOTA_EXCEEDED);
    SEG_REFUSED("not being assembled", c2, fd[2], 5, 1, 2, g, g, 2 * g, &uuid[0]);
    assert_int_equal(colld_disconnect(c2), COLLD_OK); /* its assembly goes, and its charge */
    double t0 = harness_now_ms();
    do {
        st = seg_raw(c, fd[1], 6, 0, 2, 0, g, 2 * g, &uuid[0], &id, detail, sizeof(detail));
        if (st == COLLD_ERR_QUOTA_EXCEEDED)
            harness_wait_file("/nonexistent", 5); /* the daemon sees the disconnect a moment later */
    } while (st == COLLD_ERR_QUOTA_EXCEEDED && harness_now_ms() - t0 < WAIT_MS);
    assert_int_equal(st, COLLD_OK);
    uint32_t second = 0;
    assert_int_equal(seg_raw(c, fd[2], 6, 1, 2, g, g, 2 * g, &uuid[0], &second, detail, sizeof(detail)), COLLD_OK);
    assert_true(second != 0 && second != first);
    for (int i = 0; i < SEGS; i++)
        close(fd[i]);
    assert_int_equal(colld__deregister(c, first), COLLD_OK);
    assert_int_equal(colld__deregister(c, second), COLLD_OK);
    segs_free(&sg);
    char name[64];
    vmm_name(0, name, sizeof(name));
    assert_true(daemon_unmaps(h->pid, name));
    for (int i = 0; i < WAIT_MS / 5 && daemon_vmm_fds(h->pid); i++)
        harness_wait_file("/nonexistent", 5);
    assert_int_equal(daemon_vmm_fds(h->pid), 0);
    cu->cuCtxSetCurrent(NULL);
    cu->cuDevicePrimaryCtxRelease(0);
}

/* ============================================================================================
 * colld_mem_register / colld_mem_deregister (issue 15: explicit registration)
 * ========================================================================================== */

/* The application's own buffer on the rank's GPU: a cuMem (VMM) allocation exportable as a POSIX fd
 * where the devices have VMM (group vmm), cuMemAlloc memory where not (group legacy); and the name
 * of the double's memfd that the daemon maps for it. */
typedef struct {
    CUdeviceptr p;
    size_t size;
    CUmemGenericAllocationHandle h;
    bool vmm;
    char name[96];
} appbuf_t;

static bool appbuf_make(rank_t *r, appbuf_t *b, size_t bytes)
{
    int dev = rank_device[r->rank], vmm = 0;
    CUdevice d;
    memset(b, 0, sizeof(*b));
    if (cu->cuDeviceGet(&d, dev) ||
        cu->cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, d)) {
        rank_fail(r, "device %d", dev);
        return false;
    }
    b->vmm = vmm != 0;
    if (b->vmm) {
        CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                     .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev } };
        CUmemAccessDesc acc = { .location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        size_t g = 0;
        if (cu->cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) || !g) {
            rank_fail(r, "VMM granularity");
            return false;
        }
        b->size = (bytes + g - 1) / g * g;
        if (cu->cuMemCreate(&b->h, b->size, &prop, 0) || cu->cuMemAddressReserve(&b->p, b->size, 0, 0, 0) ||
            cu->cuMemMap(b->p, b->size, 0, b->h, 0) || cu->cuMemSetAccess(b->p, b->size, &acc, 1)) {
            rank_fail(r, "a VMM buffer");
            return false;
        }
        vmm_name(dev, b->name, sizeof(b->name));
        return true;
    }
    b->size = bytes;
    if (cu->cuMemAlloc(&b->p, bytes) != CUDA_SUCCESS) {
        rank_fail(r, "cuMemAlloc");
        return false;
    }
    CUpointer_attribute at = CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID;
    unsigned long long block = 0;
    void *data = &block;
    cu->cuPointerGetAttributes(1, &at, &data, b->p);
    snprintf(b->name, sizeof(b->name), "cudafake-alloc:%d:%llu ", (int)getpid(), block);
    return true;
}

static void appbuf_free(appbuf_t *b)
{
    if (b->vmm && b->p) {
        cu->cuMemUnmap(b->p, b->size);
        cu->cuMemAddressFree(b->p, b->size);
        cu->cuMemRelease(b->h);
    } else if (b->p) {
        cu->cuMemFree(b->p);
    }
    b->p = 0;
}

/* Each rank's buffers, freed by the case once the ranks are gone (explicit registrations the
 * communicator's destruction released: the memory must outlive them). */
static appbuf_t xbuf[2][2];

/* Explicit registration, on each rank's own buffer (N_AR floats):
 *   st[0]  colld_mem_register; v[1]: the daemon maps the buffer at once, before any collective;
 *          an in-place all-reduce on it is exact (v[0]);
 *   st[1]  colld_mem_deregister; v[2]: the daemon no longer maps it;
 *   st[2]  registered again, an all-reduce posted behind a closed gate on the stream, and the
 *          handle deregistered at once (the collective not even launched yet); the gate opens: the
 *          all-reduce is exact (v[0]) and then the mapping goes (v[3]);
 *   bad input (both ranks): NULL communicator, buffer or handle, 0 bytes, a range past its
 *          allocation, host memory not from colld_mem_alloc, an unknown handle, a double
 *          deregistration; host memory from colld_mem_alloc registers as a no-op;
 *   a second buffer registered and left: the communicator's destruction releases it. */
static void sc_explicit(rank_t *r)
{
    static float host[2][N_AR];
    float *h = host[r->rank];
    appbuf_t *b = &xbuf[r->rank][0];
    void *hd = NULL, *hd2 = NULL;
    size_t bytes = N_AR * sizeof(float);
    CUdeviceptr gd = 0;
    uint32_t *gate = gate_new(&gd);
    if (!gate || !appbuf_make(r, b, bytes) || !appbuf_make(r, &xbuf[r->rank][1], bytes))
        goto out;
    void *buf = (void *)b->p;
    r->st[0] = colld_mem_register(r->comm, buf, bytes, &hd);
    r->v[1] = daemon_maps(r->h->pid, b->name);
    if (r->st[0] != COLLD_OK || !fill(r, b->p, b->p, N_AR, 0, h) ||
        !finished(r, "all-reduce on a registered buffer",
                  colld_allreduce(buf, buf, N_AR, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s)) ||
        !expect_values(r, "all-reduce on a registered buffer", b->p, N_AR, h, want_sum))
        goto out;
    r->st[1] = colld_mem_deregister(r->comm, hd);
    r->v[2] = daemon_unmaps(r->h->pid, b->name);
    /* Deregistered while its collective waits at the gate. */
    if (colld_mem_register(r->comm, buf, bytes, &hd) != COLLD_OK || !fill(r, b->p, b->p, N_AR, 0, h) ||
        cu->cuStreamWaitValue32(r->s, gd, 1, CU_STREAM_WAIT_VALUE_EQ) != CUDA_SUCCESS) {
        rank_fail(r, "registering again behind a gate");
        goto out;
    }
    colld_status_t posted = colld_allreduce(buf, buf, N_AR, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    r->st[2] = colld_mem_deregister(r->comm, hd);
    pthread_barrier_wait(r->barrier); /* both deregistered before either gate opens */
    __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
    if (!finished(r, "all-reduce deregistered while enqueued", posted) ||
        !expect_values(r, "all-reduce deregistered while enqueued", b->p, N_AR, h, want_sum))
        goto out;
    r->v[3] = daemon_unmaps(r->h->pid, b->name);
    /* Bad input. */
    void *bad = NULL, *hostbuf = malloc(4096), *shared = NULL;
    int fails = 0;
    fails += colld_mem_register(NULL, buf, bytes, &bad) != COLLD_ERR_INVALID_ARGUMENT;
    fails += colld_mem_register(r->comm, NULL, bytes, &bad) != COLLD_ERR_INVALID_ARGUMENT;
    fails += colld_mem_register(r->comm, buf, bytes, NULL) != COLLD_ERR_INVALID_ARGUMENT;
    fails += colld_mem_register(r->comm, buf, 0, &bad) != COLLD_ERR_INVALID_ARGUMENT;
    fails += colld_mem_register(r->comm, buf, b->size + 4096, &bad) != COLLD_ERR_INVALID_ARGUMENT;
    fails += !strstr(colld_comm_last_error(r->comm), "run past the end of its");
    fails += bad != NULL;
    fails += colld_mem_register(r->comm, hostbuf, 4096, &bad) != COLLD_ERR_NOT_SUPPORTED;
    fails += !strstr(colld_comm_last_error(r->comm), "host memory that is not from colld_mem_alloc");
    fails += colld_mem_deregister(r->comm, hostbuf) != COLLD_ERR_INVALID_ARGUMENT; /* never a handle */
    fails += !strstr(colld_comm_last_error(r->comm), "is not a registration of this communicator");
    fails += colld_mem_deregister(r->comm, NULL) != COLLD_ERR_INVALID_ARGUMENT;
    fails += colld_mem_deregister(NULL, hd) != COLLD_ERR_INVALID_ARGUMENT;
    fails += colld_mem_deregister(r->comm, hd) != COLLD_ERR_INVALID_ARGUMENT; /* deregistered already */
    if (colld_mem_alloc(r->c, &shared, 8192, COLLD_MEM_HOST) == COLLD_OK) {
        fails += colld_mem_register(r->comm, (char *)shared + 4096, 4096, &bad) != COLLD_OK;
        fails += colld_mem_deregister(r->comm, bad) != COLLD_OK;
        fails += colld_mem_free(r->c, shared) != COLLD_OK;
    } else {
        fails++;
    }
    free(hostbuf);
    r->v[1] += 10 * fails; /* v[1] == 1: mapped up front, and no bad input answered wrongly */
    if (fails)
        rank_fail(r, "%d bad-input checks failed; the last error: %s", fails, colld_comm_last_error(r->comm));
    /* Left registered: released by the communicator's destruction. */
    r->st[3] = colld_mem_register(r->comm, (void *)xbuf[r->rank][1].p, bytes, &hd2);
    r->v[3] += 10 * !daemon_maps(r->h->pid, xbuf[r->rank][1].name);
out:
    pthread_barrier_wait(r->barrier); /* the daemon's kernels read both ranks' buffers */
    if (gate)
        gate_free(gate);
}

static void test_explicit_registration(void **state)
{
    harness_t *h = *state;
    rank_t ranks[2];
    run_ranks(h, sc_explicit, 0, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].st[0], COLLD_OK);
        assert_int_equal(ranks[i].v[1], 1); /* mapped at registration, every bad input refused */
        assert_int_equal(ranks[i].st[1], COLLD_OK);
        assert_int_equal(ranks[i].v[2], 1); /* unmapped at deregistration */
        assert_int_equal(ranks[i].st[2], COLLD_OK);
        assert_int_equal(ranks[i].v[0], 2); /* both all-reduces exact */
        assert_int_equal(ranks[i].v[3], 1); /* unmapped once the enqueued collective finished */
        assert_int_equal(ranks[i].st[3], COLLD_OK);
    }
    /* Rank 0's client is still connected: its communicator's destruction released the handle left. */
    for (int i = 0; i < 2; i++)
        assert_true(daemon_unmaps(h->pid, xbuf[i][1].name));
    for (int i = 0; i < 2; i++) {
        CUcontext ctx;
        CU_MUST(cu->cuDevicePrimaryCtxRetain(&ctx, rank_device[i]));
        CU_MUST(cu->cuCtxSetCurrent(ctx));
        appbuf_free(&xbuf[i][0]);
        appbuf_free(&xbuf[i][1]);
        cu->cuCtxSetCurrent(NULL);
        cu->cuDevicePrimaryCtxRelease(rank_device[i]);
    }
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

/* A daemon on the double that lets a tenant hold two registrations. */
static int setup_two_regs(void **state)
{
    static const char *const args[] = { "--max-regs-per-tenant", "2", NULL };
    if (harness_test_setup_args(state, args) != 0)
        return -1;
    return daemon_on_double(((harness_t *)*state)->pid, true) ? 0 : -1;
}

gpu_cases_t gpu_reg_cases(const char *group)
{
    static const struct CMUnitTest works[] = {
        cmocka_unit_test_setup_teardown(test_registration_device_checked, setup_on_double, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_explicit_registration, setup_on_double, teardown_contexts),
    };
    static const struct CMUnitTest fixed[] = {
        cmocka_unit_test_setup_teardown(test_freed_buffer_unmapped, setup_on_double, teardown_contexts),
        cmocka_unit_test_setup_teardown(test_multisegment_vmm_buffer, setup_on_double, teardown_contexts),
        cmocka_unit_test_setup_teardown(test_segments_hostile, setup_two_regs, teardown_contexts),
    };
    static const char *const groups[] = { "vmm", "legacy", NULL };
    if (group_is(group, groups))
        return GPU_CASES(works);
    if (strcmp(group, "defects") == 0)
        return GPU_CASES(fixed);
    return GPU_NO_CASES;
}
