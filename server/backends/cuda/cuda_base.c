/*
 * cuda_base.c - what every file of the CUDA backend builds on, and which calls none of them: a
 * GPU's fault detection and usability, the lists a reset walks, the GPUs of a registration and
 * of a collective, the sessions' flag lines (ready slots, `done` targets and releases), and the
 * watcher's kick. The types are in cuda.h.
 */
#include "server/backends/cuda/cuda.h"

#include <stddef.h>
#include <stdio.h>

/* ============================================================================================
 * GPU faults (the recovery itself is cuda_recover.c's)
 * ========================================================================================== */

bool cuda_sticky(CUresult r)
{
    switch (r) {
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_NVLINK_UNCORRECTABLE:
    case CUDA_ERROR_CONTAINED:
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_TENSOR_MEMORY_LEAK:
    case CUDA_ERROR_EXTERNAL_DEVICE:
        return true;
    default:
        return false;
    }
}

const char *cuda_reset_hint(CUresult r)
{
    return cuda_sticky(r) ? "; colld resets the GPU: create a new communicator" : "";
}

void cuda_gpu_fault(colld_gpus_t *g, int gi, CUresult r)
{
    if (!g || !cuda_sticky(r))
        return;
    if (gi < 0) {
        CUcontext cur = NULL;
        CU_CHECK(g->cu, cuCtxGetCurrent, &cur);
        for (int i = 0; i < g->n && gi < 0; i++)
            if (cur && __atomic_load_n(&g->gpu[i].ctx, __ATOMIC_RELAXED) == cur)
                gi = i;
    }
    if (gi < 0 || gi >= g->n)
        return;
    int none = 0;
    if (__atomic_compare_exchange_n(&g->gpu[gi].fault, &none, (int)r, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        pthread_cond_broadcast(&g->recover_cv); /* the thread also looks once a second */
}

const char *cuda_gpu_unusable(const colld_gpus_t *g, int gi, char *buf, size_t len)
{
    const gpu_t *gpu = &g->gpu[gi];
    switch (gpu->state) {
    case GPU_OK:
        return NULL;
    case GPU_FAULTED:
    case GPU_RESETTING: {
        const char *name = NULL;
        CUresult f = (CUresult)__atomic_load_n(&gpu->fault, __ATOMIC_ACQUIRE);
        g->cu->cuGetErrorName(f, &name);
        snprintf(buf, len, "GPU %d (%s) is being reset after %s in colld's context: try again shortly", gi, gpu->name,
                 name ? name : "a CUDA error");
        return buf;
    }
    case GPU_FAILED:
    default:
        snprintf(buf, len, "GPU %d (%s) was given up by colld: %s; restart colld once the GPU is healthy", gi,
                 gpu->name, gpu->why);
        return buf;
    }
}

/* A GPU drained by a fatal health event (cuda_health.c sets it) takes no new work. */
const char *cuda_gpu_drained(const colld_gpus_t *g, int gi, char *buf, size_t len)
{
    if (gi < 0 || gi >= g->n || !g->gpu[gi].drained)
        return NULL;
    snprintf(buf, len,
             "GPU %d (%s) is drained after %s (NVML): colld takes no new work on it; restart the daemon once the GPU "
             "is fixed",
             gi, g->gpu[gi].name, g->gpu[gi].drain_why);
    return buf;
}

void cuda_watch_kick(colld_gpus_t *g)
{
    if (g->watching)
        pthread_cond_signal(&g->watch_cv);
}

/* ============================================================================================
 * What a reset drops
 * ========================================================================================== */

/* Doubly linked lists of the backend's objects, for a reset to find them (lock held). */
#define TRACK(head, x, add)                                                                                            \
    do {                                                                                                               \
        if (add) {                                                                                                     \
            (x)->prev = NULL;                                                                                          \
            (x)->next = (head);                                                                                        \
            if (head)                                                                                                  \
                (head)->prev = (x);                                                                                    \
            (head) = (x);                                                                                              \
        } else {                                                                                                       \
            if ((x)->prev)                                                                                             \
                (x)->prev->next = (x)->next;                                                                           \
            else if ((head) == (x))                                                                                    \
                (head) = (x)->next;                                                                                    \
            if ((x)->next)                                                                                             \
                (x)->next->prev = (x)->prev;                                                                           \
            (x)->next = (x)->prev = NULL;                                                                              \
        }                                                                                                              \
    } while (0)

void cuda_track_comm(colld_gpus_t *g, gpu_comm_t *gc, bool add)
{
    TRACK(g->comms, gc, add);
}

void cuda_track_session(colld_gpus_t *g, gpu_session_t *gs, bool add)
{
    TRACK(g->sessions, gs, add);
}

void cuda_track_reg(colld_gpus_t *g, gpu_reg_t *gr, bool add)
{
    TRACK(g->regs, gr, add);
}

/* ============================================================================================
 * The GPUs of registrations and collectives
 * ========================================================================================== */

int cuda_reg_gpu(const colld_reg_t *r)
{
    const gpu_reg_t *gr = r ? r->bpriv : NULL;
    return gr ? gr->gpu : -1;
}

void cuda_coll_gpus(const colld_coll_t *k, bool *used, int n)
{
    bool any = false;
    for (int i = 0; i < n; i++)
        used[i] = false;
    for (int r = 0; r < k->comm->nranks; r++)
        for (int j = 0; j < 2; j++) {
            int x = cuda_reg_gpu(j ? k->ops[r]->recv_reg : k->ops[r]->send_reg);
            if (x >= 0 && x < n)
                used[x] = any = true;
        }
    if (!any && n > 0)
        used[0] = true; /* cuda_launch.c plan_gpus: GPU 0 writes the flags when nothing moves */
}

/* ============================================================================================
 * The sessions' flag lines (proto/wire.h)
 * ========================================================================================== */

uint32_t *cuda_ready_slot(colld_backend_t *b, const colld_op_t *op, uint32_t *want)
{
    gpu_session_t *gs = gpu_session_of(b, op->session);
    uint32_t h = op->d.comm;
    *want = op->d.reserved + (uint32_t)op->id;
    if (!gs || h == 0 || h >= gs->lines)
        return NULL;
    return &gs->flags[h].ready[(uint32_t)op->id % COLLD_WIRE_GPU_READY_SLOTS];
}

void cuda_done_target(colld_backend_t *b, const colld_op_t *op, CUdeviceptr *addr, cuuint32_t *value)
{
    const gpu_session_t *gs = gpu_session_of(b, op->session);
    if (op->d.flags & COLLD_SQE_PLAN) {
        /* The plan line, validated at admission (the op is the daemon's copy). */
        *addr = (CUdeviceptr)(gs->dptr + cuda_plan_line_offset(gs, op->d.reserved) +
                              offsetof(colld_wire_gpu_plan_t, done));
        *value = 1;
        return;
    }
    *addr = (CUdeviceptr)(gs->dptr + (uint64_t)op->d.comm * sizeof(colld_wire_gpu_flag_t) +
                          offsetof(colld_wire_gpu_flag_t, done));
    *value = op->d.reserved + (uint32_t)op->id; /* flag values follow the operation id (proto/wire.h) */
}

void cuda_flag_release(colld_backend_t *b, colld_session_t *s, uint32_t handle, uint32_t value, colld_status_t st)
{
    gpu_session_t *gs = s ? gpu_session_of(b, s) : NULL;
    if (!gs || handle == 0 || handle >= gs->lines)
        return;
    colld_wire_gpu_flag_t *f = &gs->flags[handle];
    if (st != COLLD_OK)
        __atomic_store_n(&f->status, (int32_t)st, __ATOMIC_RELAXED);
    uint32_t cur = __atomic_load_n(&f->done, __ATOMIC_RELAXED);
    if ((int32_t)(value - cur) > 0)
        __atomic_store_n(&f->done, value, __ATOMIC_RELEASE);
}

void cuda_pay_releases(colld_backend_t *b, colld_dcomm_t *c)
{
    gpu_comm_t *gc = gpu_comm_of(b, c);
    if (!gc || gc->running)
        return;
    for (int r = 0; r < c->nranks; r++)
        if (gc->owe[r]) {
            gc->owe[r] = false;
            cuda_flag_release(b, c->ranks[r].session, c->ranks[r].handle, gc->owed[r], gc->owed_status);
        }
}
