/*
 * cuda_health.c - GPU health from NVML (issue 30 item 2): a thread of the CUDA backend reads, every
 * --gpu-health-ms (default 5 s, 0: off), for each GPU the backend drives (matched to its NVML
 * device by UUID):
 *
 *   volatile uncorrected ECC errors     nvmlDeviceGetTotalEccErrors (UNCORRECTED, VOLATILE)
 *   pages retired pending a reset       nvmlDeviceGetRetiredPagesPendingStatus
 *   row remaps pending / failed         nvmlDeviceGetRemappedRows
 *   critical Xid events                 an event set (nvmlEventTypeXidCriticalError), waited with a
 *                                       0 timeout, at most HEALTH_EVENTS_PER_PASS per pass
 *   NVLink errors                       nvmlDeviceGetNvLinkErrorCounter: CRC (flit, data), replay,
 *                                       recovery, summed over the active links
 *   PCIe replays                        nvmlDeviceGetPcieReplayCounter
 *   thermal and power throttling        nvmlDeviceGetCurrentClocksEventReasons (or ...ThrottleReasons)
 *
 * A pass makes at most 6 + 4 * 36 (NVLink) NVML calls per GPU and reads at most
 * HEALTH_EVENTS_PER_PASS events, all with the daemon's lock dropped; then, under the lock, it compares
 * with the last pass, records an event for every value that changed for the worse (the GPU's and
 * each communicator's using it), publishes the records (colld_daemon_t.gpu_health, server/core/
 * health.h) and drains the GPU after a fatal event:
 *
 *   - the uncorrected ECC error count rises while the daemon runs,
 *   - a row remap failed,
 *   - a critical Xid of FATAL_XIDS (docs/operations.md lists them).
 *
 * A drained GPU takes no new work (cuda_gpu_drained: new communicators with ranks on it, new
 * collectives and registrations on it are refused with COLLD_ERR_DEVICE naming it and why); what
 * runs is not torn down by health alone (a CUDA error does that: cuda_recover.c). The drain lasts
 * until the daemon restarts.
 *
 * No NVML, or no NVML device for a GPU: no health for it, said once in the log and in `collctl
 * status`; never an error. A counter NVML does not support is -1 ("not supported"); a GPU NVML
 * reports lost is said so in its record.
 */
#include "server/backends/cuda/cuda.h"

#include "common/log.h"
#include "common/nvml.h"
#include "common/util.h"
#include "server/observability/events.h"

#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#define HEALTH_EVENTS_PER_PASS 16
#define HEALTH_COMM_EVENTS 8 /* communicators told of one GPU's change (each its tenant's event) */

/* Critical Xids that drain a GPU (NVIDIA's Xid catalogue): 48 double-bit ECC error, 62 internal
 * micro-controller halt, 64 ECC page retirement or row remap recording failure, 74 NVLink error,
 * 79 GPU has fallen off the bus, 95 uncontained ECC error, 119 / 120 GSP RPC timeout / error,
 * 140 unrecovered ECC error. Other Xids are events only. */
static const unsigned FATAL_XIDS[] = { 48, 62, 64, 74, 79, 95, 119, 120, 140 };

typedef struct {
    colld_nvmlDevice_t dev;
    bool have;
    bool lost;
    int64_t ecc_base; /* the first count read (-1: none yet) */
    colld_gpu_health_t rec; /* this pass's values (health thread) */
    uint32_t xids[HEALTH_EVENTS_PER_PASS];
    int nxids;
} hdev_t;

struct cuda_health {
    colld_gpus_t *g;
    const colld_nvml_t *nv;
    colld_nvmlEventSet_t set;
    hdev_t *dev;
    int n;
    int64_t period_ms;
    pthread_t thread;
    pthread_cond_t cv; /* with the daemon's lock: stop */
    bool stop;
};

static bool fatal_xid(unsigned xid)
{
    for (size_t i = 0; i < sizeof(FATAL_XIDS) / sizeof(FATAL_XIDS[0]); i++)
        if (FATAL_XIDS[i] == xid)
            return true;
    return false;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ============================================================================================
 * Reading (lock NOT held)
 * ========================================================================================== */

/* A value read: r SUCCESS gives v, NOT_SUPPORTED (or no such entry point) -1; a lost GPU is noted. */
static int64_t value_of(hdev_t *h, colld_nvmlReturn_t r, int64_t v)
{
    if (r == COLLD_NVML_SUCCESS)
        return v;
    if (r == COLLD_NVML_ERROR_GPU_IS_LOST)
        h->lost = true;
    return -1;
}

static void read_device(struct cuda_health *hs, hdev_t *h)
{
    const colld_nvml_t *nv = hs->nv;
    colld_gpu_health_t *x = &h->rec;
    h->lost = false;
    unsigned long long ull = 0;
    unsigned a = 0, b = 0, c = 0, e = 0;
    int en = 0;
    colld_nvmlReturn_t r;

    r = nv->nvmlDeviceGetTotalEccErrors
            ? nv->nvmlDeviceGetTotalEccErrors(h->dev, COLLD_NVML_MEMORY_ERROR_TYPE_UNCORRECTED, COLLD_NVML_VOLATILE_ECC,
                                              &ull)
            : COLLD_NVML_ERROR_FUNCTION_NOT_FOUND;
    x->ecc_uncorrected = value_of(h, r, (int64_t)(ull & INT64_MAX));
    if (x->ecc_uncorrected >= 0 && h->ecc_base < 0)
        h->ecc_base = x->ecc_uncorrected;
    x->ecc_uncorrected_new = x->ecc_uncorrected >= 0 && h->ecc_base >= 0 && x->ecc_uncorrected > h->ecc_base
                                 ? x->ecc_uncorrected - h->ecc_base
                                 : (x->ecc_uncorrected < 0 ? -1 : 0);

    r = nv->nvmlDeviceGetRetiredPagesPendingStatus ? nv->nvmlDeviceGetRetiredPagesPendingStatus(h->dev, &en)
                                                   : COLLD_NVML_ERROR_FUNCTION_NOT_FOUND;
    x->retired_pending = value_of(h, r, en == COLLD_NVML_FEATURE_ENABLED);

    r = nv->nvmlDeviceGetRemappedRows ? nv->nvmlDeviceGetRemappedRows(h->dev, &a, &b, &c, &e)
                                      : COLLD_NVML_ERROR_FUNCTION_NOT_FOUND;
    x->remap_pending = value_of(h, r, c != 0);
    x->remap_failure = value_of(h, r, e != 0);

    r = nv->nvmlDeviceGetPcieReplayCounter ? nv->nvmlDeviceGetPcieReplayCounter(h->dev, &a)
                                           : COLLD_NVML_ERROR_FUNCTION_NOT_FOUND;
    x->pcie_replay = value_of(h, r, a);

    /* NVLink: the error counters of the active links (a GPU without NVLink answers NOT_SUPPORTED
     * for link 0 and is not asked further). */
    int64_t nvl = -1;
    for (unsigned link = 0; nv->nvmlDeviceGetNvLinkState && nv->nvmlDeviceGetNvLinkErrorCounter &&
                            link < COLLD_NVML_NVLINK_MAX_LINKS;
         link++) {
        en = 0;
        r = nv->nvmlDeviceGetNvLinkState(h->dev, link, &en);
        if (r != COLLD_NVML_SUCCESS) {
            (void)value_of(h, r, 0);
            break;
        }
        if (en != COLLD_NVML_FEATURE_ENABLED)
            continue;
        static const int counters[] = { COLLD_NVML_NVLINK_ERROR_DL_CRC_FLIT, COLLD_NVML_NVLINK_ERROR_DL_CRC_DATA,
                                        COLLD_NVML_NVLINK_ERROR_DL_REPLAY, COLLD_NVML_NVLINK_ERROR_DL_RECOVERY };
        for (size_t k = 0; k < sizeof(counters) / sizeof(counters[0]); k++) {
            ull = 0;
            if (nv->nvmlDeviceGetNvLinkErrorCounter(h->dev, link, counters[k], &ull) == COLLD_NVML_SUCCESS)
                nvl = (nvl < 0 ? 0 : nvl) + (int64_t)(ull & 0xffffffffffffull);
        }
    }
    x->nvlink_errors = nvl;

    ull = 0;
    if (nv->nvmlDeviceGetCurrentClocksEventReasons)
        r = nv->nvmlDeviceGetCurrentClocksEventReasons(h->dev, &ull);
    else if (nv->nvmlDeviceGetCurrentClocksThrottleReasons)
        r = nv->nvmlDeviceGetCurrentClocksThrottleReasons(h->dev, &ull);
    else
        r = COLLD_NVML_ERROR_FUNCTION_NOT_FOUND;
    x->throttle = value_of(h, r, (int64_t)(ull & 0xffffffffull));
    x->thermal = x->throttle > 0 && (x->throttle & (int64_t)COLLD_NVML_CLOCKS_THERMAL);
    x->power = x->throttle > 0 && (x->throttle & (int64_t)COLLD_NVML_CLOCKS_POWER);
}

/* The critical Xids waiting in the event set, at most HEALTH_EVENTS_PER_PASS, to their GPUs. */
static void read_events(struct cuda_health *hs)
{
    for (int i = 0; i < hs->n; i++)
        hs->dev[i].nxids = 0;
    if (!hs->set)
        return;
    for (int k = 0; k < HEALTH_EVENTS_PER_PASS; k++) {
        colld_nvmlEventData_t ev;
        memset(&ev, 0, sizeof(ev));
        if (hs->nv->nvmlEventSetWait_v2(hs->set, &ev, 0) != COLLD_NVML_SUCCESS)
            return; /* NVML_ERROR_TIMEOUT: none left */
        if (!(ev.eventType & COLLD_NVML_EVENT_XID_CRITICAL))
            continue;
        for (int i = 0; i < hs->n; i++)
            if (hs->dev[i].have && hs->dev[i].dev == ev.device && hs->dev[i].nxids < HEALTH_EVENTS_PER_PASS)
                hs->dev[i].xids[hs->dev[i].nxids++] = (uint32_t)ev.eventData;
    }
}

/* ============================================================================================
 * Publishing (lock held)
 * ========================================================================================== */

/* Does session s hold a GPU registration on GPU gi (at most 256 registrations looked at)? */
static bool session_on_gpu(const colld_backend_t *b, const colld_session_t *s, int gi)
{
    int seen = 0;
    for (const colld_reg_t *r = s->regs; r && seen < 256; r = r->next, seen++)
        if (r->device && r->backend == b && cuda_reg_gpu(r) == gi)
            return true;
    return false;
}

/* "communicator 7 ranks 0-3, communicator 9 rank 1" into buf: the local ranks whose sessions hold
 * registrations on GPU gi. Calls fn(arg, c) for each such communicator too (fn may be NULL). */
static void gpu_users(colld_backend_t *b, int gi, char *buf, size_t len, void (*fn)(void *, colld_dcomm_t *),
                      void *arg)
{
    size_t off = 0;
    buf[0] = '\0';
    for (colld_dcomm_t *c = b->d->comms; c; c = c->next) {
        int first = -1, last = -2, nrun = 0;
        bool any = false;
        char ranks[96] = "";
        size_t ro = 0;
        int nr = 0;
        for (int k = 0; k <= colld_comm_nslots(c); k++) {
            colld_member_t *m = k < colld_comm_nslots(c) ? colld_comm_slot(c, k) : NULL;
            bool on = m && m->session && !m->remote && session_on_gpu(b, m->session, gi);
            if (on && m->rank == last + 1) {
                last = m->rank;
                continue;
            }
            if (first >= 0 && ro < sizeof(ranks)) { /* close the run first..last */
                int w = first == last ? snprintf(ranks + ro, sizeof(ranks) - ro, "%s%d", nrun ? "," : "", first)
                                      : snprintf(ranks + ro, sizeof(ranks) - ro, "%s%d-%d", nrun ? "," : "", first,
                                                 last);
                ro += w > 0 ? (size_t)w : 0;
                nrun++;
            }
            first = -1;
            if (on) {
                first = last = m->rank;
                any = true;
                nr++;
            }
        }
        if (!any)
            continue;
        if (fn)
            fn(arg, c);
        if (off < len) {
            int w = snprintf(buf + off, len - off, "%scommunicator %llu rank%s %s", off ? ", " : "",
                             (unsigned long long)c->id, nr > 1 ? "s" : "", ranks);
            off += w > 0 ? (size_t)w : 0;
        }
    }
    if (off >= len && len > 4)
        memcpy(buf + len - 4, "...", 4);
}

typedef struct {
    colld_daemon_t *d;
    int n;
    colld_status_t st;
    const char *type;
    const char *text;
} comm_event_t;

static void comm_event(void *arg, colld_dcomm_t *c)
{
    comm_event_t *e = arg;
    if (e->n++ < HEALTH_COMM_EVENTS)
        colld_event(e->d, e->type, c, -1, 0, 0, 0, e->st, "%s", e->text);
}

/* An event of GPU gi: one for the daemon's operator, one per communicator using the GPU (its
 * tenant sees it), and a log line. */
static void gpu_event(colld_backend_t *b, int gi, const char *type, colld_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void gpu_event(colld_backend_t *b, int gi, const char *type, colld_status_t st, const char *fmt, ...)
{
    colld_gpus_t *g = gpus_of(b);
    char what[256], text[800], users[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    gpu_users(b, gi, users, sizeof(users), NULL, NULL);
    snprintf(text, sizeof(text), "GPU %d (%s): %s%s%s", gi, g->gpu[gi].name, what, users[0] ? ", used by " : "",
             users);
    if (st == COLLD_OK)
        LOG_WARN(GPU, "%s", text);
    else
        LOG_ERROR(GPU, "%s", text);
    colld_event(b->d, type, NULL, -1, 0, 0, 0, st, "%s", text);
    comm_event_t ce = { .d = b->d, .st = st, .type = type, .text = text };
    gpu_users(b, gi, users, sizeof(users), comm_event, &ce);
}

static void drain(colld_backend_t *b, int gi, colld_gpu_health_t *pub, const char *why)
{
    gpu_t *gpu = &gpus_of(b)->gpu[gi];
    if (gpu->drained)
        return;
    gpu->drained = true;
    colld_strlcpy(gpu->drain_why, why, sizeof(gpu->drain_why));
    pub->drained = true;
    colld_strlcpy(pub->drain_why, why, sizeof(pub->drain_why));
    pub->drained_ms = wall_ms();
    gpu_event(b, gi, "gpu_drained", COLLD_ERR_DEVICE,
              "drained after %s: colld takes no new work on it until the daemon is restarted", why);
}

/* Compare GPU gi's new values (h->rec) with what was published (pub), record the changes for the
 * worse, drain after a fatal one, publish. */
static void publish(colld_backend_t *b, int gi, hdev_t *h, colld_gpu_health_t *pub)
{
    colld_gpu_health_t *x = &h->rec;
    bool first = pub->passes == 0;
    bool worse = false;
    if (x->nvml) {
        if (!first && x->ecc_uncorrected > pub->ecc_uncorrected && pub->ecc_uncorrected >= 0) {
            worse = true;
            char why[96];
            snprintf(why, sizeof(why), "%lld uncorrected ECC error%s", (long long)x->ecc_uncorrected_new,
                     x->ecc_uncorrected_new == 1 ? "" : "s");
            gpu_event(b, gi, "gpu_ecc", COLLD_ERR_DEVICE, "uncorrected ECC errors rose from %lld to %lld",
                      (long long)pub->ecc_uncorrected, (long long)x->ecc_uncorrected);
            drain(b, gi, pub, why);
        }
        if (x->remap_failure == 1 && pub->remap_failure != 1) {
            worse = true;
            gpu_event(b, gi, "gpu_remap", COLLD_ERR_DEVICE, "a row remap failed");
            drain(b, gi, pub, "a row remap failure");
        }
        if (x->remap_pending == 1 && pub->remap_pending != 1) {
            worse = true;
            gpu_event(b, gi, "gpu_remap", COLLD_OK, "a row remap is pending: reset the GPU when it is idle");
        }
        if (x->retired_pending == 1 && pub->retired_pending != 1) {
            worse = true;
            gpu_event(b, gi, "gpu_retired_pages", COLLD_OK, "retired pages are pending: reset the GPU when it is idle");
        }
        if (!first && x->pcie_replay > pub->pcie_replay && pub->pcie_replay >= 0) {
            worse = true;
            gpu_event(b, gi, "gpu_pcie", COLLD_OK, "PCIe replay counter rose from %lld to %lld",
                      (long long)pub->pcie_replay, (long long)x->pcie_replay);
        }
        if (!first && x->nvlink_errors > pub->nvlink_errors && pub->nvlink_errors >= 0) {
            worse = true;
            gpu_event(b, gi, "gpu_nvlink", COLLD_OK, "NVLink error counters rose from %lld to %lld",
                      (long long)pub->nvlink_errors, (long long)x->nvlink_errors);
        }
        if ((x->thermal && !pub->thermal) || (x->power && !pub->power)) {
            worse = true;
            gpu_event(b, gi, "gpu_throttle", COLLD_OK, "clocks throttled (%s%s%s, reasons 0x%llx)",
                      x->thermal ? "thermal" : "", x->thermal && x->power ? ", " : "", x->power ? "power" : "",
                      (unsigned long long)x->throttle);
        }
        for (int k = 0; k < h->nxids; k++) {
            unsigned xid = h->xids[k];
            worse = true;
            x->xid_count = ++pub->xid_count;
            x->last_xid = xid;
            x->last_xid_ms = wall_ms();
            bool fatal = fatal_xid(xid);
            gpu_event(b, gi, "gpu_xid", fatal ? COLLD_ERR_DEVICE : COLLD_OK, "Xid %u%s", xid,
                      fatal ? " (critical)" : "");
            if (fatal) {
                char why[32];
                snprintf(why, sizeof(why), "Xid %u", xid);
                drain(b, gi, pub, why);
            }
        }
    }
    if (h->lost && strncmp(pub->status, "lost", 4) != 0)
        gpu_event(b, gi, "gpu_lost", COLLD_ERR_DEVICE, "NVML reports the GPU lost");
    /* The record: the new values, with what only the publishing side keeps. */
    int64_t since = pub->since_ms;
    bool drained = pub->drained;
    int64_t drained_ms = pub->drained_ms;
    char drain_why[sizeof(pub->drain_why)];
    colld_strlcpy(drain_why, pub->drain_why, sizeof(drain_why));
    uint64_t xids = pub->xid_count, passes = pub->passes;
    uint32_t last_xid = pub->last_xid;
    int64_t last_xid_ms = pub->last_xid_ms;
    *pub = *x;
    pub->xid_count = xids;
    if (h->nxids == 0) {
        pub->last_xid = last_xid;
        pub->last_xid_ms = last_xid_ms;
    }
    pub->since_ms = since ? since : (worse ? wall_ms() : 0);
    if (!pub->since_ms && x->nvml && x->ecc_uncorrected > 0) /* errors from before the daemon started */
        pub->since_ms = wall_ms();
    pub->drained = drained;
    pub->drained_ms = drained_ms;
    colld_strlcpy(pub->drain_why, drain_why, sizeof(pub->drain_why));
    pub->passes = passes + 1;
    gpu_users(b, gi, pub->users, sizeof(pub->users), NULL, NULL);
}

/* ============================================================================================
 * The thread
 * ========================================================================================== */

static void pass(struct cuda_health *hs)
{
    colld_gpus_t *g = hs->g;
    colld_daemon_t *d = g->b->d;
    read_events(hs);
    for (int i = 0; i < hs->n; i++) {
        hdev_t *h = &hs->dev[i];
        uint64_t t0 = colld_now_ns();
        if (h->have) {
            read_device(hs, h);
            h->rec.nvml = !h->lost;
            colld_strlcpy(h->rec.status, h->lost ? "lost: NVML reports the GPU lost (GPU_IS_LOST)" : "ok",
                          sizeof(h->rec.status));
        }
        h->rec.pass_ns = colld_now_ns() - t0;
    }
    pthread_mutex_lock(&d->lock);
    for (int i = 0; i < hs->n && i < d->ngpu_health; i++)
        if (hs->dev[i].have)
            publish(g->b, i, &hs->dev[i], &d->gpu_health[i]);
        else
            gpu_users(g->b, i, d->gpu_health[i].users, sizeof(d->gpu_health[i].users), NULL, NULL);
    pthread_mutex_unlock(&d->lock);
}

static void *health_main(void *arg)
{
    struct cuda_health *hs = arg;
    colld_daemon_t *d = hs->g->b->d;
    pthread_mutex_lock(&d->lock);
    while (!hs->stop) {
        pthread_mutex_unlock(&d->lock);
        pass(hs);
        pthread_mutex_lock(&d->lock);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t ns = (int64_t)ts.tv_nsec + hs->period_ms * 1000000;
        ts.tv_sec += (time_t)(ns / 1000000000);
        ts.tv_nsec = (long)(ns % 1000000000);
        while (!hs->stop && pthread_cond_timedwait(&hs->cv, &d->lock, &ts) != ETIMEDOUT) {
        }
    }
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

/* Match each GPU to its NVML device and register it for critical Xids. */
static void match_devices(struct cuda_health *hs)
{
    const colld_nvml_t *nv = hs->nv;
    colld_gpus_t *g = hs->g;
    if (nv->nvmlEventSetCreate && nv->nvmlDeviceRegisterEvents && nv->nvmlEventSetWait_v2 &&
        nv->nvmlEventSetCreate(&hs->set) != COLLD_NVML_SUCCESS)
        hs->set = NULL;
    for (int i = 0; i < hs->n; i++) {
        hdev_t *h = &hs->dev[i];
        colld_gpu_health_t *x = &h->rec;
        h->ecc_base = -1;
        x->index = i;
        colld_strlcpy(x->name, g->gpu[i].name, sizeof(x->name));
        colld_nvml_uuid_text((const unsigned char *)g->gpu[i].uuid.bytes, x->uuid, sizeof(x->uuid));
        x->ecc_uncorrected = x->ecc_uncorrected_new = x->retired_pending = x->remap_pending = x->remap_failure = -1;
        x->pcie_replay = x->nvlink_errors = x->throttle = -1;
        char buf[128];
        colld_nvmlReturn_t r = nv->nvmlDeviceGetHandleByUUID(x->uuid, &h->dev);
        if (r != COLLD_NVML_SUCCESS) {
            snprintf(x->status, sizeof(x->status), "not read: NVML has no device %s (%s)", x->uuid,
                     colld_nvml_describe(nv, r, buf, sizeof(buf)));
            LOG_INFO(GPU, "GPU %d (%s): no GPU health: %s", i, x->name, x->status);
            continue;
        }
        h->have = true;
        snprintf(x->status, sizeof(x->status), "ok");
        if (hs->set) {
            r = nv->nvmlDeviceRegisterEvents(h->dev, COLLD_NVML_EVENT_XID_CRITICAL, hs->set);
            if (r != COLLD_NVML_SUCCESS)
                LOG_INFO(GPU, "GPU %d (%s): Xid events not watched: %s", i, x->name,
                         colld_nvml_describe(nv, r, buf, sizeof(buf)));
        }
    }
}

int cuda_health_start(colld_gpus_t *g)
{
    colld_daemon_t *d = g->b->d;
    int64_t period = d->cfg.gpu_health_ms;
    colld_gpu_health_t *pub = calloc((size_t)g->n, sizeof(*pub));
    if (!pub)
        return -1;
    for (int i = 0; i < g->n; i++) {
        pub[i].index = i;
        colld_strlcpy(pub[i].name, g->gpu[i].name, sizeof(pub[i].name));
        colld_nvml_uuid_text((const unsigned char *)g->gpu[i].uuid.bytes, pub[i].uuid, sizeof(pub[i].uuid));
        pub[i].ecc_uncorrected = pub[i].ecc_uncorrected_new = pub[i].retired_pending = pub[i].remap_pending = -1;
        pub[i].remap_failure = pub[i].pcie_replay = pub[i].nvlink_errors = pub[i].throttle = -1;
    }
    char err[256] = "";
    const colld_nvml_t *nv = NULL;
    if (period <= 0)
        snprintf(err, sizeof(err), "off (--gpu-health-ms 0)");
    else if (!(nv = colld_nvml_load(err, sizeof(err))))
        LOG_INFO(GPU, "no GPU health: %s", err);
    for (int i = 0; i < g->n; i++)
        snprintf(pub[i].status, sizeof(pub[i].status), "not read: %.110s", nv ? "no pass yet" : err);
    pthread_mutex_lock(&d->lock);
    d->gpu_health = pub;
    d->ngpu_health = g->n;
    colld_strlcpy(d->gpu_health_none, nv ? "" : err, sizeof(d->gpu_health_none));
    pthread_mutex_unlock(&d->lock);
    if (!nv)
        return 0;
    struct cuda_health *hs = calloc(1, sizeof(*hs));
    hdev_t *dev = calloc((size_t)g->n, sizeof(*dev));
    if (!hs || !dev) {
        free(hs), free(dev);
        return -1;
    }
    hs->g = g;
    hs->nv = nv;
    hs->dev = dev;
    hs->n = g->n;
    hs->period_ms = period;
    match_devices(hs);
    LOG_INFO(GPU, "GPU health from NVML (%s) every %lld ms", nv->path, (long long)period);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&hs->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc == 0 && (rc = pthread_create(&hs->thread, NULL, health_main, hs)) != 0)
        pthread_cond_destroy(&hs->cv);
    if (rc != 0) {
        LOG_WARN(GPU, "cannot start the GPU health thread (%s): no GPU health", strerror(rc));
        if (hs->set)
            nv->nvmlEventSetFree(hs->set);
        free(dev), free(hs);
        return 0;
    }
    pthread_setname_np(hs->thread, "colld-gpuhealth");
    g->health = hs;
    return 0;
}

void cuda_health_stop(colld_gpus_t *g)
{
    colld_daemon_t *d = g->b->d;
    struct cuda_health *hs = g->health;
    if (hs) {
        pthread_mutex_lock(&d->lock);
        hs->stop = true;
        pthread_cond_broadcast(&hs->cv);
        pthread_mutex_unlock(&d->lock);
        pthread_join(hs->thread, NULL);
        pthread_cond_destroy(&hs->cv);
        if (hs->set)
            hs->nv->nvmlEventSetFree(hs->set);
        free(hs->dev);
        free(hs);
        g->health = NULL;
    }
    pthread_mutex_lock(&d->lock);
    free(d->gpu_health);
    d->gpu_health = NULL;
    d->ngpu_health = 0;
    pthread_mutex_unlock(&d->lock);
}
