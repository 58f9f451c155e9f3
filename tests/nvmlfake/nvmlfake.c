/*
 * nvmlfake.c - the NVML test double (README.md): a libnvidia-ml.so.1 for tests only, exporting
 * the NVML functions colld calls (common/nvml.h) and colld_nvmlfake_control, over devices that
 * are the CUDA driver test double's (tests/cudafake): the same count (COLLD_CUDAFAKE_DEVICES: a
 * number or '|'-separated specifications; 1 when unset), the same default UUIDs
 * (GPU-c011d0fa-4be0-4d0b-8a2e-0000000000NN for device NN) and names (a spec's name=, else "CUDA
 * driver test double device NN"). Every counter starts at 0, nothing throttles, no NVLink is active.
 *
 * A test sets values through control lines, "gpu=N key=value ...", given to colld_nvmlfake_control
 * in-process or appended to the file COLLD_NVMLFAKE_CONTROL names (read anew, from where it was left,
 * at every NVML call: the daemon is a separate process):
 *
 *   ecc_uncorrected=V  retired_pending=0|1  remap_pending=0|1  remap_failure=0|1  pcie_replay=V
 *   nvlinks=K (links 0..K-1 active)  nvlink_errors=V (CRC flit count of link 0)  throttle=MASK
 *   xid=X (queue a critical Xid event)  unsupported=KEY (that counter answers NOT_SUPPORTED)
 *   lost=1 (every call on the device answers GPU_IS_LOST)
 *   init_error=R (without gpu=: nvmlInit_v2 answers R)
 *
 * The types are colld's declarations of NVML's ABI (common/nvml.h), so that each function here has
 * the signature colld calls.
 */
#include "common/nvml.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define API __attribute__((visibility("default")))
#define NF_MAX_DEVICES 16
#define NF_MAX_EVENTS 64
#define NF_MAX_SETS 8

enum { K_ECC, K_RETIRED, K_REMAP_PENDING, K_REMAP_FAILURE, K_PCIE, K_NVLINK, K_THROTTLE, K_N };
static const char *const key_names[K_N] = { "ecc_uncorrected", "retired_pending", "remap_pending", "remap_failure",
                                            "pcie_replay",     "nvlink_errors",   "throttle" };

typedef struct colld_nvmlDevice_st {
    int index;
    char name[96];
    char uuid[48];
    unsigned long long v[K_N];
    bool unsupported[K_N];
    bool lost;
    unsigned nvlinks;
} nf_device_t;

typedef struct colld_nvmlEventSet_st {
    bool used;
    unsigned long long mask[NF_MAX_DEVICES];
} nf_set_t;

typedef struct {
    int dev;
    unsigned xid;
    unsigned delivered; /* bit per set */
} nf_event_t;

static struct {
    pthread_mutex_t mu;
    bool configured;
    int init_error;
    int ndev;
    nf_device_t dev[NF_MAX_DEVICES];
    nf_set_t sets[NF_MAX_SETS];
    nf_event_t events[NF_MAX_EVENTS];
    int nevents;
    char control[4096];
    long offset;
    char partial[512];
} nf = { .mu = PTHREAD_MUTEX_INITIALIZER };

/* Apply one control line (mu held): 0, or -1 when it is malformed (nothing of it applied then). */
static int apply(const char *line)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", line);
    int gpu = -1;
    char *save = NULL;
    /* first pass: the GPU and validation */
    for (char *kv = strtok_r(buf, " \t\r\n", &save); kv; kv = strtok_r(NULL, " \t\r\n", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq)
            return -1;
        if (strncmp(kv, "gpu=", 4) == 0)
            gpu = atoi(eq + 1);
    }
    if (gpu >= nf.ndev)
        return -1;
    snprintf(buf, sizeof(buf), "%s", line);
    for (char *kv = strtok_r(buf, " \t\r\n", &save); kv; kv = strtok_r(NULL, " \t\r\n", &save)) {
        char *eq = strchr(kv, '=');
        *eq = '\0';
        const char *k = kv, *v = eq + 1;
        unsigned long long n = strtoull(v, NULL, 0);
        if (strcmp(k, "gpu") == 0)
            continue;
        if (strcmp(k, "init_error") == 0) {
            nf.init_error = (int)n;
            continue;
        }
        if (gpu < 0)
            return -1;
        nf_device_t *d = &nf.dev[gpu];
        bool known = false;
        for (int i = 0; i < K_N; i++) {
            if (strcmp(k, key_names[i]) == 0) {
                d->v[i] = n;
                known = true;
            } else if (strcmp(k, "unsupported") == 0 && strcmp(v, key_names[i]) == 0) {
                d->unsupported[i] = true;
                known = true;
            }
        }
        if (strcmp(k, "lost") == 0) {
            d->lost = n != 0;
            known = true;
        } else if (strcmp(k, "nvlinks") == 0) {
            d->nvlinks = (unsigned)(n > COLLD_NVML_NVLINK_MAX_LINKS ? COLLD_NVML_NVLINK_MAX_LINKS : n);
            known = true;
        } else if (strcmp(k, "xid") == 0) {
            if (nf.nevents < NF_MAX_EVENTS)
                nf.events[nf.nevents++] = (nf_event_t){ .dev = gpu, .xid = (unsigned)n };
            known = true;
        }
        if (!known)
            return -1;
    }
    return 0;
}

/* The devices, from the CUDA driver double's configuration (mu held). */
static void configure(void)
{
    if (nf.configured)
        return;
    nf.configured = true;
    const char *env = getenv("COLLD_CUDAFAKE_DEVICES");
    const char *ctl = getenv("COLLD_NVMLFAKE_CONTROL");
    snprintf(nf.control, sizeof(nf.control), "%s", ctl ? ctl : "");
    char specs[NF_MAX_DEVICES][256];
    int n = 1;
    memset(specs, 0, sizeof(specs));
    if (env && *env) {
        bool digits = true;
        for (const char *p = env; *p; p++)
            digits &= isdigit((unsigned char)*p) != 0;
        if (digits) {
            n = atoi(env);
        } else {
            n = 0;
            for (const char *p = env; p && n < NF_MAX_DEVICES;) {
                const char *next = strpbrk(p, ";|");
                size_t len = next ? (size_t)(next - p) : strlen(p);
                snprintf(specs[n], sizeof(specs[n]), "%.*s", (int)(len < 255 ? len : 255), p);
                n++;
                p = next ? next + 1 : NULL;
            }
        }
    }
    nf.ndev = n < 0 ? 0 : n > NF_MAX_DEVICES ? NF_MAX_DEVICES : n;
    for (int i = 0; i < nf.ndev; i++) {
        nf_device_t *d = &nf.dev[i];
        d->index = i;
        snprintf(d->name, sizeof(d->name), "CUDA driver test double device %d", i);
        const char *name = strstr(specs[i], "name=");
        if (name && (name == specs[i] || name[-1] == ','))
            snprintf(d->name, sizeof(d->name), "%.*s", (int)strcspn(name + 5, ","), name + 5);
        snprintf(d->uuid, sizeof(d->uuid), "GPU-c011d0fa-4be0-4d0b-8a2e-0000000000%02x", i);
    }
}

/* Apply the lines appended to the control file since the last look (mu held). */
static void poll_control(void)
{
    configure();
    if (!nf.control[0])
        return;
    FILE *f = fopen(nf.control, "r");
    if (!f)
        return;
    if (fseek(f, nf.offset, SEEK_SET) == 0) {
        char line[512];
        while (fgets(line, sizeof(line), f)) {
            if (!strchr(line, '\n'))
                break; /* not complete yet: read again next time */
            nf.offset += (long)strlen(line);
            if (line[0] != '#' && line[0] != '\n' && apply(line) != 0)
                fprintf(stderr, "the NVML test double: malformed control line: %s", line);
        }
    }
    fclose(f);
}

#define ENTER()                                                                                                        \
    pthread_mutex_lock(&nf.mu);                                                                                        \
    poll_control()
#define RETURN(r)                                                                                                      \
    do {                                                                                                               \
        colld_nvmlReturn_t r_ = (r);                                                                                   \
        pthread_mutex_unlock(&nf.mu);                                                                                  \
        return r_;                                                                                                     \
    } while (0)

static bool valid(colld_nvmlDevice_t d)
{
    return d && d >= &nf.dev[0] && d < &nf.dev[nf.ndev];
}

/* A counter of device d: its value, NOT_SUPPORTED, GPU_IS_LOST. */
static colld_nvmlReturn_t counter(colld_nvmlDevice_t d, int k, unsigned long long *out)
{
    if (!valid(d) || !out)
        return COLLD_NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost)
        return COLLD_NVML_ERROR_GPU_IS_LOST;
    if (d->unsupported[k])
        return COLLD_NVML_ERROR_NOT_SUPPORTED;
    *out = d->v[k];
    return COLLD_NVML_SUCCESS;
}

/* ============================================================================================
 * NVML
 * ========================================================================================== */

API colld_nvmlReturn_t nvmlInit_v2(void);
API colld_nvmlReturn_t nvmlInit_v2(void)
{
    ENTER();
    RETURN(nf.init_error ? nf.init_error : COLLD_NVML_SUCCESS);
}

API colld_nvmlReturn_t nvmlShutdown(void);
API colld_nvmlReturn_t nvmlShutdown(void)
{
    return COLLD_NVML_SUCCESS;
}

API const char *nvmlErrorString(colld_nvmlReturn_t r);
API const char *nvmlErrorString(colld_nvmlReturn_t r)
{
    switch (r) {
    case COLLD_NVML_SUCCESS: return "Success";
    case COLLD_NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case COLLD_NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case COLLD_NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case COLLD_NVML_ERROR_NOT_FOUND: return "Not Found";
    case COLLD_NVML_ERROR_TIMEOUT: return "Timeout";
    case COLLD_NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case 9: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

API colld_nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, colld_nvmlDevice_t *dev);
API colld_nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, colld_nvmlDevice_t *dev)
{
    ENTER();
    if (!uuid || !dev)
        RETURN(COLLD_NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < nf.ndev; i++)
        if (strcasecmp(uuid, nf.dev[i].uuid) == 0) {
            *dev = &nf.dev[i];
            RETURN(COLLD_NVML_SUCCESS);
        }
    RETURN(COLLD_NVML_ERROR_NOT_FOUND);
}

API colld_nvmlReturn_t nvmlDeviceGetName(colld_nvmlDevice_t d, char *name, unsigned int len);
API colld_nvmlReturn_t nvmlDeviceGetName(colld_nvmlDevice_t d, char *name, unsigned int len)
{
    ENTER();
    if (!valid(d) || !name || !len)
        RETURN(COLLD_NVML_ERROR_INVALID_ARGUMENT);
    snprintf(name, len, "%s", d->name);
    RETURN(COLLD_NVML_SUCCESS);
}

API colld_nvmlReturn_t nvmlDeviceGetTotalEccErrors(colld_nvmlDevice_t d, int type, int counter_type,
                                                   unsigned long long *count);
API colld_nvmlReturn_t nvmlDeviceGetTotalEccErrors(colld_nvmlDevice_t d, int type, int counter_type,
                                                   unsigned long long *count)
{
    ENTER();
    if (type != COLLD_NVML_MEMORY_ERROR_TYPE_UNCORRECTED || counter_type != COLLD_NVML_VOLATILE_ECC)
        RETURN(COLLD_NVML_ERROR_NOT_SUPPORTED); /* the double keeps only the volatile uncorrected count */
    RETURN(counter(d, K_ECC, count));
}

API colld_nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(colld_nvmlDevice_t d, int *pending);
API colld_nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(colld_nvmlDevice_t d, int *pending)
{
    ENTER();
    unsigned long long v = 0;
    colld_nvmlReturn_t r = pending ? counter(d, K_RETIRED, &v) : COLLD_NVML_ERROR_INVALID_ARGUMENT;
    if (r == COLLD_NVML_SUCCESS)
        *pending = v ? COLLD_NVML_FEATURE_ENABLED : 0;
    RETURN(r);
}

API colld_nvmlReturn_t nvmlDeviceGetRemappedRows(colld_nvmlDevice_t d, unsigned int *corr, unsigned int *unc,
                                                 unsigned int *pending, unsigned int *failure);
API colld_nvmlReturn_t nvmlDeviceGetRemappedRows(colld_nvmlDevice_t d, unsigned int *corr, unsigned int *unc,
                                                 unsigned int *pending, unsigned int *failure)
{
    ENTER();
    unsigned long long p = 0, f = 0;
    if (!corr || !unc || !pending || !failure)
        RETURN(COLLD_NVML_ERROR_INVALID_ARGUMENT);
    colld_nvmlReturn_t r = counter(d, K_REMAP_PENDING, &p);
    if (r == COLLD_NVML_SUCCESS)
        r = counter(d, K_REMAP_FAILURE, &f);
    if (r == COLLD_NVML_SUCCESS) {
        *corr = *unc = 0;
        *pending = (unsigned)p;
        *failure = (unsigned)f;
    }
    RETURN(r);
}

API colld_nvmlReturn_t nvmlDeviceGetPcieReplayCounter(colld_nvmlDevice_t d, unsigned int *v);
API colld_nvmlReturn_t nvmlDeviceGetPcieReplayCounter(colld_nvmlDevice_t d, unsigned int *v)
{
    ENTER();
    unsigned long long x = 0;
    colld_nvmlReturn_t r = v ? counter(d, K_PCIE, &x) : COLLD_NVML_ERROR_INVALID_ARGUMENT;
    if (r == COLLD_NVML_SUCCESS)
        *v = (unsigned)x;
    RETURN(r);
}

API colld_nvmlReturn_t nvmlDeviceGetNvLinkState(colld_nvmlDevice_t d, unsigned int link, int *active);
API colld_nvmlReturn_t nvmlDeviceGetNvLinkState(colld_nvmlDevice_t d, unsigned int link, int *active)
{
    ENTER();
    if (!valid(d) || !active || link >= COLLD_NVML_NVLINK_MAX_LINKS)
        RETURN(COLLD_NVML_ERROR_INVALID_ARGUMENT);
    if (d->lost)
        RETURN(COLLD_NVML_ERROR_GPU_IS_LOST);
    if (!d->nvlinks)
        RETURN(COLLD_NVML_ERROR_NOT_SUPPORTED); /* a GPU without NVLink */
    *active = link < d->nvlinks ? COLLD_NVML_FEATURE_ENABLED : 0;
    RETURN(COLLD_NVML_SUCCESS);
}

API colld_nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(colld_nvmlDevice_t d, unsigned int link, int which,
                                                       unsigned long long *v);
API colld_nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(colld_nvmlDevice_t d, unsigned int link, int which,
                                                       unsigned long long *v)
{
    ENTER();
    if (!valid(d) || !v || link >= d->nvlinks)
        RETURN(COLLD_NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long x = 0;
    colld_nvmlReturn_t r = counter(d, K_NVLINK, &x);
    if (r == COLLD_NVML_SUCCESS)
        *v = link == 0 && which == COLLD_NVML_NVLINK_ERROR_DL_CRC_FLIT ? x : 0;
    RETURN(r);
}

API colld_nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(colld_nvmlDevice_t d, unsigned long long *reasons);
API colld_nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(colld_nvmlDevice_t d, unsigned long long *reasons)
{
    ENTER();
    RETURN(counter(d, K_THROTTLE, reasons));
}

API colld_nvmlReturn_t nvmlEventSetCreate(colld_nvmlEventSet_t *set);
API colld_nvmlReturn_t nvmlEventSetCreate(colld_nvmlEventSet_t *set)
{
    ENTER();
    if (!set)
        RETURN(COLLD_NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < NF_MAX_SETS; i++)
        if (!nf.sets[i].used) {
            memset(&nf.sets[i], 0, sizeof(nf.sets[i]));
            nf.sets[i].used = true;
            *set = &nf.sets[i];
            RETURN(COLLD_NVML_SUCCESS);
        }
    RETURN(20 /* NVML_ERROR_MEMORY */);
}

API colld_nvmlReturn_t nvmlEventSetFree(colld_nvmlEventSet_t set);
API colld_nvmlReturn_t nvmlEventSetFree(colld_nvmlEventSet_t set)
{
    ENTER();
    if (!set || set < &nf.sets[0] || set >= &nf.sets[NF_MAX_SETS] || !set->used)
        RETURN(COLLD_NVML_ERROR_INVALID_ARGUMENT);
    set->used = false;
    RETURN(COLLD_NVML_SUCCESS);
}

API colld_nvmlReturn_t nvmlDeviceRegisterEvents(colld_nvmlDevice_t d, unsigned long long types,
                                                colld_nvmlEventSet_t set);
API colld_nvmlReturn_t nvmlDeviceRegisterEvents(colld_nvmlDevice_t d, unsigned long long types,
                                                colld_nvmlEventSet_t set)
{
    ENTER();
    if (!valid(d) || !set || set < &nf.sets[0] || set >= &nf.sets[NF_MAX_SETS] || !set->used)
        RETURN(COLLD_NVML_ERROR_INVALID_ARGUMENT);
    if (types & ~COLLD_NVML_EVENT_XID_CRITICAL)
        RETURN(COLLD_NVML_ERROR_NOT_SUPPORTED); /* the double has Xid events only */
    set->mask[d->index] |= types;
    RETURN(COLLD_NVML_SUCCESS);
}

/* The first Xid of a device the set is registered for that it has not been given (mu held). */
static bool take_event(colld_nvmlEventSet_t set, colld_nvmlEventData_t *data)
{
    unsigned bit = 1u << (set - &nf.sets[0]);
    for (int i = 0; i < nf.nevents; i++) {
        nf_event_t *e = &nf.events[i];
        if ((e->delivered & bit) || !(set->mask[e->dev] & COLLD_NVML_EVENT_XID_CRITICAL))
            continue;
        e->delivered |= bit;
        memset(data, 0, sizeof(*data));
        data->device = &nf.dev[e->dev];
        data->eventType = COLLD_NVML_EVENT_XID_CRITICAL;
        data->eventData = e->xid;
        return true;
    }
    return false;
}

API colld_nvmlReturn_t nvmlEventSetWait_v2(colld_nvmlEventSet_t set, colld_nvmlEventData_t *data, unsigned int ms);
API colld_nvmlReturn_t nvmlEventSetWait_v2(colld_nvmlEventSet_t set, colld_nvmlEventData_t *data, unsigned int ms)
{
    for (unsigned waited = 0;; waited++) {
        ENTER();
        if (!set || !data || set < &nf.sets[0] || set >= &nf.sets[NF_MAX_SETS] || !set->used)
            RETURN(COLLD_NVML_ERROR_INVALID_ARGUMENT);
        if (take_event(set, data))
            RETURN(COLLD_NVML_SUCCESS);
        pthread_mutex_unlock(&nf.mu);
        if (waited >= ms)
            return COLLD_NVML_ERROR_TIMEOUT;
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
}

/* ============================================================================================
 * Control (the double only)
 * ========================================================================================== */

/* Apply a control line in this process: 0, or -1 when it is malformed. */
API int colld_nvmlfake_control(const char *line);
API int colld_nvmlfake_control(const char *line)
{
    pthread_mutex_lock(&nf.mu);
    configure();
    int rc = line ? apply(line) : -1;
    pthread_mutex_unlock(&nf.mu);
    return rc;
}
