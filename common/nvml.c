/*
 * nvml.c - load NVML at run time (see nvml.h).
 */
#include "common/nvml.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define NVML_LIB "libnvidia-ml.so.1"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static colld_nvml_t table;
static const colld_nvml_t *loaded;
static char load_error[256];

const char *colld_nvml_describe(const colld_nvml_t *nv, colld_nvmlReturn_t r, char *buf, size_t len)
{
    const char *text = nv && nv->nvmlErrorString ? nv->nvmlErrorString(r) : NULL;
    snprintf(buf, len, "NVML error %d (%.96s)", (int)r, text ? text : "no description");
    return buf;
}

void colld_nvml_uuid_text(const unsigned char u[16], char *buf, size_t len)
{
    snprintf(buf, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
             u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

static void load_once(void)
{
    void *h = dlopen(NVML_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        snprintf(load_error, sizeof(load_error), "no NVML (%.200s)", why ? why : NVML_LIB " not found");
        return;
    }
#define COLLD_NVML_LOOKUP(name, ret, args, req)                                                                        \
    {                                                                                                                  \
        void *fn = dlsym(h, #name);                                                                                    \
        if (!fn && (req)) {                                                                                            \
            snprintf(load_error, sizeof(load_error), "%s has no %s: NVML too old", NVML_LIB, #name);                   \
            dlclose(h);                                                                                                \
            return;                                                                                                    \
        }                                                                                                              \
        memcpy(&table.name, &fn, sizeof(fn));                                                                          \
    }
    COLLD_NVML_FUNCS(COLLD_NVML_LOOKUP)
#undef COLLD_NVML_LOOKUP
    Dl_info info;
    void *sym = NULL;
    memcpy(&sym, &table.nvmlInit_v2, sizeof(sym));
    if (dladdr(sym, &info) && info.dli_fname)
        snprintf(table.path, sizeof(table.path), "%s", info.dli_fname);
    colld_nvmlReturn_t r = table.nvmlInit_v2();
    if (r != COLLD_NVML_SUCCESS) {
        char buf[160];
        snprintf(load_error, sizeof(load_error), "nvmlInit failed: %s", colld_nvml_describe(&table, r, buf, sizeof(buf)));
        return; /* the library stays mapped: a later dlopen would give the same answer */
    }
    loaded = &table;
}

const colld_nvml_t *colld_nvml_load(char *err, size_t len)
{
    pthread_once(&once, load_once);
    if (!loaded && err && len)
        snprintf(err, len, "%s", load_error);
    return loaded;
}
