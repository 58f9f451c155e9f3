/*
 * gpu_driver.c - the GPU test drivers' command line, driver loading and rank arguments
 * (gpu_driver.h).
 */
#include "tests/gpu/gpu_driver.h"

#include "tests/gpu/gpu_cu.h"
#include "tests/integration/harness_double.h"
#include "tests/integration/harness_opts.h"

#include <stdio.h>
#include <string.h>

/* Whether name is one of groups (NULL-terminated) or "all". */
static bool known_group(const char *const *groups, const char *name)
{
    if (strcmp(name, "all") == 0)
        return true;
    for (int i = 0; groups[i]; i++)
        if (strcmp(groups[i], name) == 0)
            return true;
    return false;
}

static int usage(const char *prog, const char *const *groups)
{
    fprintf(stderr, "usage: %s [", prog);
    for (int i = 0; groups[i]; i++)
        fprintf(stderr, "%s|", groups[i]);
    fprintf(stderr, "all] [--gpus N] [--cudafake]\n");
    return 2;
}

int gpu_driver_start(gpu_driver_t *g, int argc, char **argv, const char *const *groups)
{
    memset(g, 0, sizeof(*g));
    g->group = "all";
    g->gpus = 1;
    const harness_opt_t opts[] = { HARNESS_INT("gpus", &g->gpus), HARNESS_SET("cudafake", &g->cudafake) };
    /* The group is the one argument that is not an option: take it out first. */
    char *rest[64];
    int n = 0;
    for (int i = 0; i < argc && n < 63; i++) {
        if (i > 0 && argv[i][0] != '-' && strcmp(argv[i - 1], "--gpus") != 0)
            g->group = argv[i];
        else
            rest[n++] = argv[i];
    }
    rest[n] = NULL;
    if (HARNESS_PARSE_OPTS(argv[0], n, rest, opts) != 0 || g->gpus < 1 || !known_group(groups, g->group))
        return usage(argv[0], groups);
    gpu_cu_t cu;
    char err[512];
    /* Before any CUDA call of ours: with --cudafake, the driver must be the test double. */
    gpu_cu_result_t loaded = gpu_cu_load(&cu, g->cudafake, err, sizeof(err));
    if (loaded != GPU_CU_OK) {
        printf("%s%s\n", loaded == GPU_CU_NONE ? "SKIP: " : "", err);
        return loaded == GPU_CU_NONE ? 77 : 1;
    }
    if (g->cudafake && harness_double_find(g->double_path, sizeof(g->double_path), false) != 1)
        return 1;
    g->ndev = cu.ndev;
    if (g->gpus > cu.ndev) {
        printf("SKIP: --gpus %d, but %d GPU(s) visible\n", g->gpus, cu.ndev);
        return g->cudafake ? 1 : 77;
    }
    snprintf(g->gpus_text, sizeof(g->gpus_text), "%d", g->gpus);
    g->common_args[g->ncommon++] = "--gpus";
    g->common_args[g->ncommon++] = g->gpus_text;
    if (g->cudafake)
        g->common_args[g->ncommon++] = "--cudafake";
    return -1;
}

void gpu_driver_say(const gpu_driver_t *g)
{
    printf("%d of %d GPU(s) visible used%s\n", g->gpus, g->ndev,
           g->cudafake ? ": the CUDA driver test double (GPU paths run against a driver test double, never on "
                         "hardware)"
                       : "");
}

bool gpu_driver_runs(const gpu_driver_t *g, const char *group)
{
    return strcmp(g->group, "all") == 0 || strcmp(g->group, group) == 0;
}

int gpu_driver_add_args(const gpu_driver_t *g, const char **argv, int n, const char *const *extra)
{
    for (int i = 0; extra && extra[i] && n < GPU_DRIVER_MAX_ARGS; i++)
        argv[n++] = extra[i];
    for (int i = 0; g->common_args[i] && n < GPU_DRIVER_MAX_ARGS; i++)
        argv[n++] = g->common_args[i];
    argv[n] = NULL;
    return n;
}

bool gpu_driver_daemon_ok(const gpu_driver_t *g, pid_t pid)
{
    return !g->cudafake || harness_daemon_on_double(pid, g->double_path, false);
}
