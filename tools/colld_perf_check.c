/*
 * colld_perf_check.c - colld-perf's data: the input generator of a run and the reference results
 * that every received element is checked against (ref_t: colld_perf.h).
 *
 * Checking (-c 1, the default): after the timed iterations the inputs are regenerated from a
 * deterministic generator (a different salt than the timed ones, receive buffers filled with a
 * sentinel), the collective runs once more, and every element this rank receives is compared
 * bitwise with the result of the scalar reference kernel (rank order 0..n-1, the same
 * deterministic order the daemon guarantees). #wrong is the number of differing elements summed
 * over ranks; for reduce only the root receives. With --join the inputs are small integers
 * (colld_cpu_pattern_small), exact in any order: daemons on several nodes combine per node first,
 * so general float inputs would differ from the rank-order reference in the last bits.
 */
#include "colld_perf.h"
#include "tools/testdata/pattern.h"
#include "kernels/cpu/reduce.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_CHUNK 16384 /* elements per step of the reference computation */

/* Ranks that --join may sit on several daemons, which reduce per node first: an order other than
 * rank order, so float results would differ from the rank-order oracle in the last bits. Their
 * inputs are small integers, exact in any order (colld_cpu_pattern_small); launched ranks share
 * one daemon, which reduces in rank order, and get the general inputs. */
int perf_ref_alloc(ref_t *f, int n, bool any_order)
{
    memset(f, 0, sizeof(*f));
    f->pattern = any_order ? colld_cpu_pattern_small : colld_cpu_pattern;
    for (int r = 0; r < n; r++)
        if (!(f->in[r] = malloc(CHECK_CHUNK * 8)))
            return -1;
    return (f->want = malloc(CHECK_CHUNK * 8)) ? 0 : -1;
}

void perf_ref_free(ref_t *f)
{
    for (int r = 0; r < MAX_RANKS; r++)
        free(f->in[r]);
    free(f->want);
}

/* Count the elements of `got` (this rank's receive elements of the call) that differ bitwise from
 * the reference result for inputs generated with `salt`. Returns the count, or SIZE_MAX when the
 * reference kernel refuses (it should not). */
size_t perf_count_wrong(const shape_t *s, int n, int rank, unsigned salt, const unsigned char *got, ref_t *f)
{
    size_t es = colld_dtype_size(s->dt), wrong = 0;
    if (s->kind == K_REDUCE && rank != s->root)
        return 0; /* only the root receives */
    for (size_t base = 0; base < s->recv_elems; base += CHECK_CHUNK) {
        size_t m = s->recv_elems - base < CHECK_CHUNK ? s->recv_elems - base : CHECK_CHUNK;
        switch (s->kind) {
        case K_BROADCAST:
            f->pattern(s->dt, s->root, salt, base, m, f->want);
            break;
        case K_ALLGATHER: /* element j of the result is element j % count of rank j / count */
            for (size_t j = 0; j < m;) {
                size_t e = base + j, r = e / s->count, off = e % s->count;
                size_t run = s->count - off < m - j ? s->count - off : m - j;
                f->pattern(s->dt, (int)r, salt, off, run, f->want + j * es);
                j += run;
            }
            break;
        default: { /* the reductions: reduce-scatter receives slice `rank` */
            size_t first = (s->kind == K_REDUCESCATTER ? (size_t)rank * s->count : 0) + base;
            const void *in[MAX_RANKS];
            for (int r = 0; r < n; r++) {
                f->pattern(s->dt, r, salt, first, m, f->in[r]);
                in[r] = f->in[r];
            }
            void *out[1] = { f->want };
            if (colld_cpu_reduce_scalar(s->dt, s->op, in, n, out, 1, m) != COLLD_OK)
                return SIZE_MAX;
            break;
        }
        }
        const unsigned char *g = got + base * es;
        if (memcmp(g, f->want, m * es) == 0)
            continue;
        for (size_t i = 0; i < m; i++)
            wrong += memcmp(g + i * es, f->want + i * es, es) != 0;
    }
    return wrong;
}
