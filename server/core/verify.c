/*
 * verify.c - result verification's checksums and verdicts (verify.h). The checksum is XXH3 from
 * libxxhash (Debian's libxxhash-dev): tens of GB/s on one core, so verifying costs about one
 * extra read of every result buffer.
 */
#include "server/core/verify.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>
#endif

/* On x86-64 libxxhash's dispatching entry picks the widest vector unit at run time (AVX2 or
 * AVX-512; the plain entry is built for the baseline SSE2 and ran at a third of the speed here). */
uint64_t colld_verify_sum(const void *p, size_t len)
{
#if defined(__x86_64__)
    return (uint64_t)XXH3_64bits_dispatch(p, len);
#else
    return (uint64_t)XXH3_64bits(p, len);
#endif
}

int colld_verify_verdict(const uint64_t *sums, int n, int *ref, bool *majority)
{
    *ref = 0;
    *majority = false;
    /* Boyer-Moore vote, then a count: the majority value if there is one. */
    int cand = 0, votes = 0;
    for (int i = 0; i < n; i++) {
        if (votes == 0)
            cand = i, votes = 1;
        else
            votes += sums[i] == sums[cand] ? 1 : -1;
    }
    int same = 0;
    for (int i = 0; i < n; i++)
        same += sums[i] == sums[cand];
    if (2 * same > n) {
        *ref = cand;
        *majority = true;
        /* the lowest index holding the majority's value, so that every node names the same one */
        for (int i = 0; i < n; i++)
            if (sums[i] == sums[cand]) {
                *ref = i;
                break;
            }
    }
    int differ = 0;
    for (int i = 0; i < n; i++)
        differ += sums[i] != sums[*ref];
    return differ;
}

uint64_t colld_verify_first_diff(const void *a, const void *b, uint64_t count, size_t es)
{
    const unsigned char *pa = a, *pb = b;
    const uint64_t block = 4096; /* elements compared per memcmp */
    for (uint64_t i = 0; i < count; i += block) {
        uint64_t m = count - i < block ? count - i : block;
        if (memcmp(pa + i * es, pb + i * es, m * es) == 0)
            continue;
        for (uint64_t j = i; j < i + m; j++)
            if (memcmp(pa + j * es, pb + j * es, es) != 0)
                return j;
    }
    return count;
}

bool colld_verify_hook_parse(const char *text, int *rank, uint64_t *elem)
{
    *rank = -2;
    *elem = 0;
    if (!text || !*text)
        return true;
    char *end;
    if (strncmp(text, "node:", 5) == 0) {
        *rank = -1;
        text += 5;
    } else {
        long r = strtol(text, &end, 10);
        if (end == text || *end != ':' || r < 0 || r >= COLLD_MAX_RANKS)
            return false;
        *rank = (int)r;
        text = end + 1;
    }
    unsigned long long e = strtoull(text, &end, 10);
    if (end == text || *end) {
        *rank = -2;
        return false;
    }
    *elem = e;
    return true;
}
