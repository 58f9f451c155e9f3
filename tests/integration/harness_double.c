/*
 * harness_double.c - GPU tests on the CUDA driver test double only (harness_double.h).
 */
#include "tests/integration/harness_double.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int harness_double_find(char *path, size_t len, bool quiet)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return 0;
    void *ctl = dlsym(lib, "colld_cudafake_control");
    Dl_info info = { 0 };
    char real[PATH_MAX];
    if (ctl && dladdr(ctl, &info) && info.dli_fname)
        snprintf(path, len, "%s", realpath(info.dli_fname, real) ? real : info.dli_fname);
    if (!ctl && !quiet) {
        void *any = dlsym(lib, "cuGetProcAddress");
        printf("libcuda.so.1 here is not the CUDA driver test double (%s): refusing to run GPU tests on it\n",
               any && dladdr(any, &info) && info.dli_fname ? info.dli_fname : "unknown path");
    }
    dlclose(lib);
    return ctl ? 1 : -1;
}

bool harness_daemon_on_double(pid_t pid, const char *double_path, bool must_map)
{
    char path[64], line[4608];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot read %s: the daemon (pid %d) is gone\n", path, (int)pid);
        return false;
    }
    bool on_double = false, other = false;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        const char *file = strchr(line, '/');
        if (!file || (!strstr(file, "libcuda.so") && !strstr(file, "libnccl")))
            continue;
        if (strcmp(file, double_path) == 0) {
            on_double = true;
        } else if (!other) {
            other = true;
            fprintf(stderr, "the daemon (pid %d) maps %s, not only the CUDA driver test double %s\n", (int)pid, file,
                    double_path);
        }
    }
    fclose(f);
    if (must_map && !on_double && !other)
        fprintf(stderr, "the daemon (pid %d) has not loaded the CUDA driver test double %s\n", (int)pid, double_path);
    return (on_double || !must_map) && !other;
}
