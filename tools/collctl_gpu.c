/*
 * collctl_gpu.c - GPU health in `collctl status` (a section per GPU, and its JSON) and in `collctl
 * doctor` (its findings), from the daemon's GpuHealth records (server/backends/cuda/cuda_health.c;
 * docs/operations.md, "GPU health").
 */
#include "tools/collctl.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

/* A counter, or "not supported" (-1). */
static const char *num(int64_t v, char *buf, size_t len)
{
    if (v < 0)
        snprintf(buf, len, "not supported");
    else
        snprintf(buf, len, "%lld", (long long)v);
    return buf;
}

/* "03:12" in local time. */
static void hhmm(int64_t unix_ms, char *buf, size_t len)
{
    time_t t = (time_t)(unix_ms / 1000);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, len, "%H:%M", &tm);
}

void collctl_gpu_text(const Colld__V1__StatusResponse *r)
{
    if (!r->n_gpus)
        return;
    printf("\nGPUS (%zu)%s%s\n", r->n_gpus, *r->gpu_health_none ? ": no health: " : "", r->gpu_health_none);
    for (size_t i = 0; i < r->n_gpus; i++) {
        const Colld__V1__GpuHealth *g = r->gpus[i];
        char a[24], b[24], c[24], d[24], e[24];
        printf("  GPU %d (%s) %s: %s%s%s\n", g->index, g->name, g->uuid, g->drained ? "DRAINED after " : "",
               g->drained ? g->drain_reason : "", g->drained ? "" : g->status);
        if (g->nvml) {
            printf("         ECC uncorrected (volatile): %s (%lld since colld started); retired pages pending: %s; "
                   "row remap pending: %s, failed: %s\n",
                   num(g->ecc_uncorrected, a, sizeof(a)), (long long)(g->ecc_uncorrected_new > 0 ? g->ecc_uncorrected_new : 0),
                   num(g->retired_pending, b, sizeof(b)), num(g->remap_pending, c, sizeof(c)),
                   num(g->remap_failure, d, sizeof(d)));
            printf("         critical Xids: %llu", (unsigned long long)g->xid_count);
            if (g->xid_count)
                printf(" (last: Xid %u)", g->last_xid);
            printf("; NVLink errors: %s; PCIe replays: %s; throttled: %s\n", num(g->nvlink_errors, a, sizeof(a)),
                   num(g->pcie_replay, e, sizeof(e)),
                   g->throttle_reasons < 0 ? "not supported"
                   : g->thermal && g->power ? "thermal, power"
                   : g->thermal             ? "thermal"
                   : g->power               ? "power"
                                            : "no");
        }
        if (*g->users)
            printf("         used by %s\n", g->users);
    }
}

void collctl_gpu_json(const Colld__V1__StatusResponse *r)
{
    printf(",\"gpu_health_none\":");
    collctl_json_str(r->gpu_health_none);
    printf(",\"gpus\":[");
    for (size_t i = 0; i < r->n_gpus; i++) {
        const Colld__V1__GpuHealth *g = r->gpus[i];
        printf("%s{\"index\":%d,\"name\":", i ? "," : "", g->index);
        collctl_json_str(g->name);
        printf(",\"uuid\":");
        collctl_json_str(g->uuid);
        printf(",\"status\":");
        collctl_json_str(g->status);
        printf(",\"nvml\":%s,\"ecc_uncorrected\":%lld,\"ecc_uncorrected_new\":%lld,\"retired_pending\":%lld,"
               "\"remap_pending\":%lld,\"remap_failure\":%lld,\"pcie_replay\":%lld,\"nvlink_errors\":%lld,"
               "\"xid_count\":%llu,\"last_xid\":%u,\"throttle_reasons\":%lld,\"thermal\":%s,\"power\":%s,"
               "\"since_unix_ms\":%lld,\"drained\":%s,\"drain_reason\":",
               g->nvml ? "true" : "false", (long long)g->ecc_uncorrected, (long long)g->ecc_uncorrected_new,
               (long long)g->retired_pending, (long long)g->remap_pending, (long long)g->remap_failure,
               (long long)g->pcie_replay, (long long)g->nvlink_errors, (unsigned long long)g->xid_count, g->last_xid,
               (long long)g->throttle_reasons, g->thermal ? "true" : "false", g->power ? "true" : "false",
               (long long)g->since_unix_ms, g->drained ? "true" : "false");
        collctl_json_str(g->drain_reason);
        printf(",\"users\":");
        collctl_json_str(g->users);
        printf(",\"pass_ns\":%llu}", (unsigned long long)g->pass_ns);
    }
    printf("]");
}

int collctl_gpu_findings(const Colld__V1__GpuHealth *g, const char *node, collctl_gpu_finding_t *out, int max)
{
    int n = 0;
    char who[160], since[16] = "", users[240] = "";
    snprintf(who, sizeof(who), "GPU %d (%s)%s%s", g->index, g->name, node && *node ? " on node " : "",
             node && *node ? node : "");
    if (g->since_unix_ms)
        hhmm(g->since_unix_ms, since, sizeof(since));
    if (*g->users)
        snprintf(users, sizeof(users), ", used by %s", g->users);
#define FINDING(prob, tag, ...)                                                                                        \
    do {                                                                                                               \
        if (n < max) {                                                                                                 \
            out[n].problem = (prob);                                                                                   \
            snprintf(out[n].what, sizeof(out[n].what), "%s", (tag));                                                  \
            snprintf(out[n].text, sizeof(out[n].text), __VA_ARGS__);                                                   \
            n++;                                                                                                       \
        }                                                                                                              \
    } while (0)
    if (!g->nvml) {
        if (strncmp(g->status, "lost", 4) == 0)
            FINDING(true, "gpu-lost", "%s: %s%s", who, g->status, users);
        return n;
    }
    if (g->ecc_uncorrected > 0)
        FINDING(true, "gpu-ecc", "%s: %lld uncorrected ECC error%s%s%s%s", who, (long long)g->ecc_uncorrected,
                g->ecc_uncorrected == 1 ? "" : "s", *since ? " since " : "", since, users);
    if (g->remap_failure == 1)
        FINDING(true, "gpu-remap", "%s: a row remap failed%s", who, users);
    if (g->xid_count)
        FINDING(g->drained, "gpu-xid", "%s: %llu critical Xid event(s), last Xid %u%s", who,
                (unsigned long long)g->xid_count, g->last_xid, users);
    if (g->drained)
        FINDING(true, "gpu-drained",
                "%s is drained after %s: colld refuses new work on it; restart colld once the GPU is fixed%s", who,
                g->drain_reason, users);
    if (g->remap_pending == 1 || g->retired_pending == 1)
        FINDING(false, "gpu-pending", "%s: %s pending: reset the GPU when it is idle%s", who,
                g->remap_pending == 1 ? "a row remap" : "retired pages", users);
    if (g->thermal || g->power)
        FINDING(false, "gpu-throttle", "%s: clocks throttled (%s%s%s)%s", who, g->thermal ? "thermal" : "",
                g->thermal && g->power ? ", " : "", g->power ? "power" : "", users);
    if (g->nvlink_errors > 0)
        FINDING(false, "gpu-nvlink", "%s: %lld NVLink errors (CRC, replay, recovery)%s", who,
                (long long)g->nvlink_errors, users);
    if (g->pcie_replay > 0)
        FINDING(false, "gpu-pcie", "%s: %lld PCIe replays%s", who, (long long)g->pcie_replay, users);
#undef FINDING
    return n;
}
