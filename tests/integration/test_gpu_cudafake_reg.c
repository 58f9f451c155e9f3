/*
 * test_gpu_cudafake_reg.c - GPU registrations: the device a registration names is checked by the
 * daemon (issue 15 C5, group vmm/legacy), a buffer the application freed leaves the daemon (C1/D4,
 * group defects), a buffer across several VMM allocations of one reservation (D2, open: group
 * open_defects). See harness_gpu.h.
 */
#include "tests/integration/harness_gpu.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

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
         * registration of the buffer it freed (client/cuda.c sweep_freed): the daemon's mapping
         * went with it. Rank 1 disconnected: its session's registrations went with it too. */
        char name[128];
        if (defect_vmm) {
            CUuuid u0, u1;
            CU_MUST(cu->cuDeviceGetUuid(&u0, 0));
            CU_MUST(cu->cuDeviceGetUuid(&u1, 1));
            char hex0[33], hex1[33];
            for (int b = 0; b < 16; b++) {
                snprintf(hex0 + 2 * b, 3, "%02x", (unsigned char)u0.bytes[b]);
                snprintf(hex1 + 2 * b, 3, "%02x", (unsigned char)u1.bytes[b]);
            }
            snprintf(name, sizeof(name), "cudafake-vmm:%s", hex0);
            assert_false(daemon_maps(h->pid, name));
            snprintf(name, sizeof(name), "cudafake-vmm:%s", hex1);
            assert_false(daemon_maps(h->pid, name));
        } else {
            snprintf(name, sizeof(name), "cudafake-alloc:%d:%ld ", (int)getpid(), ranks[0].v[0]);
            assert_false(daemon_maps(h->pid, name));
            snprintf(name, sizeof(name), "cudafake-alloc:%d:%ld ", (int)getpid(), ranks[1].v[0]);
            assert_false(daemon_maps(h->pid, name));
        }
    }
}

/* ============================================================================================
 * Buffers across several VMM allocations (issue 15 D2)
 * ========================================================================================== */

/* D2: a buffer across two VMM allocations mapped back to back in one reservation (PyTorch's
 * expandable segments) is refused: the client registers the mapping that holds the pointer
 * (client/cuda.c resolve, cuMemGetAddressRange) and the buffer runs past it. Fix: register every
 * mapping the buffer covers. */
static void sc_multisegment(rank_t *r)
{
    CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                 .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                 .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = r->rank } };
    CUmemAccessDesc acc = { .location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    size_t g = 0;
    CUmemGenericAllocationHandle h[2];
    CUdeviceptr va = 0;
    if (cu->cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ||
        cu->cuMemCreate(&h[0], g, &prop, 0) || cu->cuMemCreate(&h[1], g, &prop, 0) ||
        cu->cuMemAddressReserve(&va, 2 * g, 0, 0, 0) || cu->cuMemMap(va, g, 0, h[0], 0) ||
        cu->cuMemMap(va + g, g, 0, h[1], 0) || cu->cuMemSetAccess(va, 2 * g, &acc, 1))
        return rank_fail(r, "two VMM allocations in one reservation");
    void *buf = (void *)(va + g - 4096);
    r->st[0] = colld_allreduce(buf, buf, 2048, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s); /* 8 KiB over the seam */
    snprintf(r->detail, sizeof(r->detail), "%s", colld_comm_last_error(r->comm));
    cu->cuMemUnmap(va, 2 * g);
    cu->cuMemAddressFree(va, 2 * g);
    cu->cuMemRelease(h[0]);
    cu->cuMemRelease(h[1]);
}

static void test_open_defect_D2_multisegment_vmm_refused(void **state)
{
    open_defect("D2",
                "a buffer across two VMM allocations of one reservation is refused with COLLD_ERR_INVALID_ARGUMENT",
                "every mapping the buffer covers is registered and the collective runs");
    rank_t ranks[2];
    run_ranks(*state, sc_multisegment, 0, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].st[0], COLLD_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(ranks[i].detail, "bytes run past the end of its"));
    }
}

gpu_cases_t gpu_reg_cases(const char *group)
{
    static const struct CMUnitTest works[] = {
        cmocka_unit_test_setup_teardown(test_registration_device_checked, setup_on_double, harness_test_teardown),
    };
    static const struct CMUnitTest fixed[] = {
        cmocka_unit_test_setup_teardown(test_freed_buffer_unmapped, setup_on_double, teardown_contexts),
    };
    static const struct CMUnitTest open[] = {
        cmocka_unit_test_setup_teardown(test_open_defect_D2_multisegment_vmm_refused, setup_on_double,
                                        teardown_contexts),
    };
    static const char *const groups[] = { "vmm", "legacy", NULL };
    if (group_is(group, groups))
        return GPU_CASES(works);
    if (strcmp(group, "defects") == 0)
        return GPU_CASES(fixed);
    if (strcmp(group, "open_defects") == 0)
        return GPU_CASES(open);
    return GPU_NO_CASES;
}
