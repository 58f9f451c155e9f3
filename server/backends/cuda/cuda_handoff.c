/*
 * cuda_handoff.c - the hand-off without the host (issue 28 item 1): a matched collective whose
 * buffers are all on one GPU is launched at once, behind a stream memory wait on every rank's
 * ready slot and a gate kernel, and followed by a kernel that writes every rank's done word
 * (kernels/cuda/handoff.cu; cuda_kernels.h says what each does). The daemon's host threads then
 * only see the collective finish (its event), or abandon it: a time-out, a peer lost, an abort or
 * a faulted GPU writes the collective's cancel word and then the awaited values into the slots
 * still short of them (so that the queued waits end), its kernels do nothing, and the ranks'
 * streams are released with the error status as in the host's hand-off (cuda_coll.c).
 *
 * Here: which collectives take it, their descriptor (the addresses, filled under the lock when
 * the collective matches), their words (cancel, arrived, gate) in host memory registered for the
 * GPUs (a block of the GPUs' pool g->ho_blocks, cuda_mem.c), the cancel, and the verdict read once
 * the collective's event fired.
 *
 * It is opt-in (--gpu-early-launch, default off) until measured on a GPU. The waits hold no
 * multiprocessor (a wait kernel did before: without MPS, resident in the daemon's context while the
 * ranks' streams were behind, it could take time slices from the application's kernels); whether
 * the daemon's context, with only stream waits queued, still takes time slices is to be measured.
 * The host's hand-off (the watcher sees every rank's ready slot, then the engine launches) is the
 * default, and also serves, with the option on, collectives over buffers on several GPUs (their
 * other GPUs' kernels would need the gate across GPUs) and plans' replays (cuda_plan.c).
 */
#include "server/backends/cuda/cuda.h"

#include "common/log.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>

/* A collective's hand-off (colld_coll_t.bhand). */
struct gpu_handoff {
    colld_cuda_handoff_t h;               /* the addresses (h.words: the block's, once armed) */
    uint32_t *slot[COLLD_CUDA_MAX_RANKS]; /* each rank's ready slot as the daemon addresses it */
    cuda_hostblk_t *block;  /* NULL until armed: COLLD_CUDA_HANDOFF_WORDS words */
    bool launched;          /* back from its launch (lock held) */
    bool cancel;            /* the daemon abandons it (lock held): written to the words once launched */
};

bool cuda_handoff_wanted(colld_backend_t *b, const colld_coll_t *k)
{
    colld_gpus_t *g = gpus_of(b);
    if (!b->d->cfg.gpu_early_launch || k->comm->nranks > COLLD_CUDA_MAX_RANKS) /* a plan's run never asks */
        return false;
    bool used[64] = { false };
    int n = g->n < 64 ? g->n : 64, nused = 0;
    cuda_coll_gpus(k, used, n);
    for (int i = 0; i < n; i++)
        nused += used[i];
    if (nused != 1)
        return false;
    for (int r = 0; r < k->comm->nranks; r++) {
        uint32_t want;
        const gpu_session_t *gs = gpu_session_of(b, k->ops[r]->session);
        if (!gs || !gs->registered || !cuda_ready_slot(b, k->ops[r], &want))
            return false;
    }
    return true;
}

colld_status_t cuda_handoff_prepare(colld_backend_t *b, colld_coll_t *k)
{
    struct gpu_handoff *x = calloc(1, sizeof(*x));
    if (!x)
        return COLLD_ERR_NO_MEMORY;
    int n = k->comm->nranks;
    x->h.n = n;
    for (int r = 0; r < n; r++) {
        const colld_op_t *op = k->ops[r];
        const gpu_session_t *gs = gpu_session_of(b, op->session);
        uint32_t want;
        uint32_t *slot = cuda_ready_slot(b, op, &want);
        CUdeviceptr done;
        cuuint32_t value;
        x->h.ready[r] = (uint32_t *)(uintptr_t)(gs->dptr + (uint64_t)((char *)slot - (char *)gs->flags));
        x->h.want[r] = want;
        x->slot[r] = slot; /* the session (each op holds it) keeps its flag area mapped until k ends */
        cuda_done_target(b, op, &done, &value);
        x->h.done[r] = (uint32_t *)(uintptr_t)done;
        x->h.done_value[r] = value;
    }
    k->bhand = x;
    gpu_comm_t *gc = gpu_comm_of(b, k->comm);
    if (!gc->handoff_said) {
        gc->handoff_said = true;
        LOG_INFO(GPU,
                 "communicator %llu: its collectives on one GPU wait for the ranks' streams on the GPU (the "
                 "hand-off without the host, --gpu-early-launch)",
                 (unsigned long long)k->comm->id);
    }
    return COLLD_OK;
}

CUresult cuda_handoff_arm(colld_gpus_t *g, colld_coll_t *k, int gi, const colld_cuda_handoff_t **h)
{
    struct gpu_handoff *x = k->bhand;
    CUresult r = CUDA_SUCCESS;
    cuda_hostblk_t *blk = cuda_hostblk_get(g, &g->ho_blocks, gi, &r);
    if (!blk)
        return r;
    /* Plain stores: the gate kernel that reads them is launched after, on this thread. */
    memset(blk->mem, 0, COLLD_CUDA_HANDOFF_WORDS * sizeof(uint32_t));
    x->block = blk;
    x->h.words = (uint32_t *)(uintptr_t)blk->dptr;
    *h = &x->h;
    return CUDA_SUCCESS;
}

const uint32_t *cuda_handoff_gate(const colld_coll_t *k)
{
    const struct gpu_handoff *x = k->bhand;
    return x && x->block ? x->h.words + COLLD_CUDA_HANDOFF_GATE : NULL;
}

/* Abandon a launched hand-off: the cancel word, then the awaited value in every slot short of it,
 * so that the stream waits queued on them end and the gate kernel behind them sees the cancel. A
 * slot that holds its value already or is taken (~want: the gate ran, every rank had arrived) is
 * left alone; the compare-and-swap loses to a rank's stream writing the value meanwhile, which
 * ends that wait as well. A rank's stream that gets there later writes the same value. */
static void write_cancel(struct gpu_handoff *x)
{
    if (!x->block)
        return;
    __atomic_store_n(&((uint32_t *)x->block->mem)[COLLD_CUDA_HANDOFF_CANCEL], 1u, __ATOMIC_SEQ_CST);
    for (int r = 0; r < x->h.n; r++) {
        uint32_t want = x->h.want[r], v = __atomic_load_n(x->slot[r], __ATOMIC_ACQUIRE);
        while (v != want && v != ~want &&
               !__atomic_compare_exchange_n(x->slot[r], &v, want, false, __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE)) {
        }
    }
}

void cuda_handoff_abandon(colld_coll_t *k)
{
    struct gpu_handoff *x = k->bhand;
    if (x)
        write_cancel(x);
}

void cuda_handoff_launched(colld_coll_t *k)
{
    struct gpu_handoff *x = k->bhand;
    if (!x)
        return;
    x->launched = true;
    if (x->cancel)
        write_cancel(x);
}

void cuda_handoff_cancel(colld_coll_t *k)
{
    struct gpu_handoff *x = k->bhand;
    if (!x || x->cancel)
        return;
    x->cancel = true;
    if (x->launched)
        write_cancel(x);
}

bool cuda_handoff_open(const colld_coll_t *k)
{
    const struct gpu_handoff *x = k->bhand;
    return x && x->block &&
           __atomic_load_n(&((uint32_t *)x->block->mem)[COLLD_CUDA_HANDOFF_GATE], __ATOMIC_ACQUIRE) == COLLD_CUDA_GATE_GO;
}

bool cuda_handoff_waits(const colld_coll_t *k)
{
    const struct gpu_handoff *x = k->bhand;
    return x && !x->cancel && !cuda_handoff_open(k);
}

void cuda_handoff_release(colld_gpus_t *g, colld_coll_t *k)
{
    struct gpu_handoff *x = k->bhand;
    if (!x)
        return;
    k->bhand = NULL;
    if (x->block)
        cuda_hostblk_put(g, &g->ho_blocks, x->block);
    free(x);
}
