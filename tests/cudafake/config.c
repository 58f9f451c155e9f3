/*
 * config.c - the CUDA driver test double's configuration, read from the environment once (the
 * only file of the double that calls getenv).
 *
 *   COLLD_CUDAFAKE_DEVICES         "N" (N default devices, 0: none) or device specifications
 *                                  separated by ';' or '|', each "key=value,..." (README.md
 *                                  lists the keys); unset: one default device
 *   COLLD_CUDAFAKE_DRIVER_VERSION  what cuDriverGetVersion reports (default 13000); entry points
 *                                  of later versions are not found
 *   COLLD_CUDAFAKE_FAULTS          fault specifications (fault.c)
 *   COLLD_CUDAFAKE_CONTROL         a file of more fault specifications, appended to at run time
 *   COLLD_CUDAFAKE_ARENA           bytes of address space reserved for device memory (default 128 GiB)
 *   CUDA_VISIBLE_DEVICES           as the driver: indices or GPU-<uuid> prefixes, up to the first
 *                                  invalid entry
 * A malformed value makes cuInit fail with CUDA_ERROR_INVALID_VALUE and says why on stderr.
 */
#include "tests/cudafake/fake.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_DRIVER 13000
#define DEFAULT_ARENA (128ull << 30)
#define GIB (1ull << 30)
#define MIB (1ull << 20)

/* Record the first configuration error. */
static void bad(fk_config_t *cfg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bad(fk_config_t *cfg, const char *fmt, ...)
{
    if (cfg->error[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cfg->error, sizeof(cfg->error), fmt, ap);
    va_end(ap);
}

/* A device with the defaults (an H100-like GPU); its UUID is derived from its index so that every
 * process of a test sees the same devices. */
static void default_device(fk_device_spec_t *d, int index)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->name, sizeof(d->name), "CUDA driver test double device %d", index);
    static const unsigned char prefix[12] = { 0xc0, 0x11, 0xd0, 0xfa, 0x4b, 0xe0, 0x4d, 0x0b,
                                              0x8a, 0x2e, 0x00, 0x00 };
    memcpy(d->uuid.bytes, prefix, sizeof(prefix));
    d->uuid.bytes[15] = (char)index;
    d->cc_major = 9;
    d->cc_minor = 0;
    d->sms = 132;
    d->total_mem = 16 * GIB;
    d->gran_min = 2 * MIB;
    d->gran_rec = 2 * MIB;
    d->memops = true;
    d->memops64 = true;
    d->wait_nor = true;
    d->vmm = true;
    d->posix_fd = true;
    d->ipc = true;
}

/* "12", "64K", "2M", "16G" -> bytes; false when malformed. */
static bool parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (end == s || errno)
        return false;
    unsigned long long mul = 1;
    switch (*end) {
    case 'K': case 'k': mul = 1ull << 10; end++; break;
    case 'M': case 'm': mul = 1ull << 20; end++; break;
    case 'G': case 'g': mul = 1ull << 30; end++; break;
    default: break;
    }
    if (*end || (v && mul > ~0ull / v))
        return false;
    *out = (size_t)(v * mul);
    return true;
}

/* A whole decimal (or 0x) int of moderate size; false when malformed. */
static bool parse_int(const char *s, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 0);
    if (end == s || *end || errno || v < -(1l << 30) || v > (1l << 30))
        return false;
    *out = (int)v;
    return true;
}

/* 32 hex digits, '-' ignored, an optional "GPU-" prefix. */
static bool parse_uuid(const char *s, unsigned char out[16])
{
    if (strncmp(s, "GPU-", 4) == 0)
        s += 4;
    int n = 0;
    for (; *s; s++) {
        if (*s == '-')
            continue;
        if (!isxdigit((unsigned char)*s) || n == 32)
            return false;
        int v = isdigit((unsigned char)*s) ? *s - '0' : tolower((unsigned char)*s) - 'a' + 10;
        if (n % 2 == 0)
            out[n / 2] = (unsigned char)(v << 4);
        else
            out[n / 2] |= (unsigned char)v;
        n++;
    }
    return n == 32;
}

/* One "key=value" of a device specification. */
static void device_key(fk_config_t *cfg, fk_device_spec_t *d, int index, char *kv)
{
    char *eq = strchr(kv, '=');
    if (!eq) {
        bad(cfg, "COLLD_CUDAFAKE_DEVICES: device %d: '%s' is not key=value", index, kv);
        return;
    }
    *eq = '\0';
    const char *k = kv, *v = eq + 1;
    int iv = 0;
    struct {
        const char *key;
        bool *flag;
    } flags[] = {
        { "memops", &d->memops }, { "memops_v1", &d->memops_v1 }, { "memops64", &d->memops64 },
        { "nor", &d->wait_nor },  { "flush", &d->flush },         { "vmm", &d->vmm },
        { "fd", &d->posix_fd },   { "ipc", &d->ipc },
    };
    for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++)
        if (strcmp(k, flags[i].key) == 0) {
            if (!parse_int(v, &iv) || (iv != 0 && iv != 1))
                bad(cfg, "COLLD_CUDAFAKE_DEVICES: device %d: %s must be 0 or 1", index, k);
            *flags[i].flag = iv == 1;
            return;
        }
    if (strcmp(k, "name") == 0) {
        if (strlen(v) >= sizeof(d->name))
            bad(cfg, "COLLD_CUDAFAKE_DEVICES: device %d: name too long", index);
        snprintf(d->name, sizeof(d->name), "%s", v);
    } else if (strcmp(k, "uuid") == 0) {
        if (!parse_uuid(v, (unsigned char *)d->uuid.bytes))
            bad(cfg, "COLLD_CUDAFAKE_DEVICES: device %d: uuid '%s' is not 32 hex digits", index, v);
    } else if (strcmp(k, "cc") == 0) {
        if (sscanf(v, "%d.%d", &d->cc_major, &d->cc_minor) != 2 || d->cc_major < 1)
            bad(cfg, "COLLD_CUDAFAKE_DEVICES: device %d: cc '%s' is not MAJOR.MINOR", index, v);
    } else if (strcmp(k, "sms") == 0) {
        if (!parse_int(v, &d->sms) || d->sms < 1)
            bad(cfg, "COLLD_CUDAFAKE_DEVICES: device %d: sms must be a positive number", index);
    } else if (strcmp(k, "mem") == 0 || strcmp(k, "gran") == 0 || strcmp(k, "rgran") == 0) {
        size_t *dst = k[0] == 'm' ? &d->total_mem : k[0] == 'g' ? &d->gran_min : &d->gran_rec;
        if (!parse_size(v, dst) || (k[0] != 'm' && (*dst < 4096 || (*dst & (*dst - 1)))))
            bad(cfg, "COLLD_CUDAFAKE_DEVICES: device %d: %s '%s' is not a valid size%s", index, k, v,
                k[0] != 'm' ? " (a power of two, at least 4096)" : "");
    } else if (strcmp(k, "peer") == 0) {
        if (!parse_int(v, &d->peer_group))
            bad(cfg, "COLLD_CUDAFAKE_DEVICES: device %d: peer must be a group number", index);
    } else if (k[0] == 'a' && isdigit((unsigned char)k[1])) {
        int attr;
        if (!parse_int(k + 1, &attr) || !parse_int(v, &iv) || d->nattrs == (int)(sizeof(d->attrs) / sizeof(d->attrs[0])))
            bad(cfg, "COLLD_CUDAFAKE_DEVICES: device %d: attribute override %s=%s is malformed (or too many)", index, k,
                v);
        else
            d->attrs[d->nattrs++] = (fk_attr_t){ .attr = attr, .value = iv };
    } else {
        bad(cfg, "COLLD_CUDAFAKE_DEVICES: device %d: unknown key '%s'", index, k);
    }
}

/* COLLD_CUDAFAKE_DEVICES into cfg->dev. */
static void parse_devices(fk_config_t *cfg, const char *env)
{
    int n;
    if (!env) {
        cfg->ndev = 1;
        default_device(&cfg->dev[0], 0);
        return;
    }
    if (parse_int(env, &n)) {
        if (n < 0 || n > FK_MAX_DEVICES) {
            bad(cfg, "COLLD_CUDAFAKE_DEVICES=%d: 0 to %d devices", n, FK_MAX_DEVICES);
            return;
        }
        for (int i = 0; i < n; i++)
            default_device(&cfg->dev[i], i);
        cfg->ndev = n;
        return;
    }
    char buf[4096];
    if (strlen(env) >= sizeof(buf)) {
        bad(cfg, "COLLD_CUDAFAKE_DEVICES is too long");
        return;
    }
    snprintf(buf, sizeof(buf), "%s", env);
    char *save = NULL;
    int i = 0;
    for (char *spec = buf; spec; i++) {
        char *next = strpbrk(spec, ";|");
        if (next)
            *next++ = '\0';
        if (i == FK_MAX_DEVICES) {
            bad(cfg, "COLLD_CUDAFAKE_DEVICES: at most %d devices", FK_MAX_DEVICES);
            return;
        }
        default_device(&cfg->dev[i], i);
        for (char *kv = strtok_r(spec, ",", &save); kv; kv = strtok_r(NULL, ",", &save))
            device_key(cfg, &cfg->dev[i], i, kv);
        if (cfg->dev[i].gran_rec < cfg->dev[i].gran_min)
            cfg->dev[i].gran_rec = cfg->dev[i].gran_min;
        spec = next;
    }
    cfg->ndev = i;
}

/* CUDA_VISIBLE_DEVICES: keep and reorder the devices it names, up to its first invalid entry. */
static void apply_visible(fk_config_t *cfg, const char *env)
{
    if (!env)
        return;
    fk_device_spec_t *all = malloc(sizeof(cfg->dev));
    if (!all) {
        bad(cfg, "out of memory");
        return;
    }
    memcpy(all, cfg->dev, sizeof(cfg->dev));
    int nall = cfg->ndev, n = 0;
    bool used[FK_MAX_DEVICES] = { false };
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", env);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok && n < FK_MAX_DEVICES; tok = strtok_r(NULL, ",", &save)) {
        int idx = -1;
        if (parse_int(tok, &idx)) {
            if (idx < 0 || idx >= nall)
                break;
        } else if (strncmp(tok, "GPU-", 4) == 0) {
            for (int j = 0; j < nall && idx < 0; j++) {
                char hex[40];
                for (int b = 0; b < 16; b++)
                    snprintf(hex + 2 * b, 3, "%02x", (unsigned char)all[j].uuid.bytes[b]);
                const char *want = tok + 4;
                size_t k = 0, h = 0;
                for (; want[k]; k++) {
                    if (want[k] == '-')
                        continue;
                    if (h == 32 || tolower((unsigned char)want[k]) != hex[h])
                        break;
                    h++;
                }
                if (!want[k] && h > 0)
                    idx = j;
            }
            if (idx < 0)
                break;
        } else {
            break;
        }
        if (used[idx])
            break;
        used[idx] = true;
        cfg->dev[n++] = all[idx];
    }
    cfg->ndev = n;
    free(all);
}

/* Read every variable of the double's environment into cfg (errors in cfg->error). */
void fk_config_load(fk_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    parse_devices(cfg, getenv("COLLD_CUDAFAKE_DEVICES"));
    apply_visible(cfg, getenv("CUDA_VISIBLE_DEVICES"));
    cfg->driver_version = DEFAULT_DRIVER;
    const char *v = getenv("COLLD_CUDAFAKE_DRIVER_VERSION");
    if (v && (!parse_int(v, &cfg->driver_version) || cfg->driver_version < 1000))
        bad(cfg, "COLLD_CUDAFAKE_DRIVER_VERSION=%s is not a CUDA version such as 12080", v);
    cfg->arena_bytes = DEFAULT_ARENA;
    v = getenv("COLLD_CUDAFAKE_ARENA");
    if (v && (!parse_size(v, &cfg->arena_bytes) || cfg->arena_bytes < 64 * MIB))
        bad(cfg, "COLLD_CUDAFAKE_ARENA=%s is not a size of at least 64M", v);
    v = getenv("COLLD_CUDAFAKE_FAULTS");
    if (v && strlen(v) >= sizeof(cfg->faults))
        bad(cfg, "COLLD_CUDAFAKE_FAULTS is too long");
    else if (v)
        snprintf(cfg->faults, sizeof(cfg->faults), "%s", v);
    v = getenv("COLLD_CUDAFAKE_CONTROL");
    if (v && strlen(v) >= sizeof(cfg->control_path))
        bad(cfg, "COLLD_CUDAFAKE_CONTROL is too long");
    else if (v)
        snprintf(cfg->control_path, sizeof(cfg->control_path), "%s", v);
}
