/*
 * verify.h - result verification (--verify-results, colld_comm_config_t.verify_results): the
 * checksum of a result buffer and the verdict over several results that should be equal (ranks
 * on one node, nodes of a multi-node communicator). The backends call it after an all-reduce;
 * what they name (a rank and its pid, a node and its address) is theirs.
 */
#ifndef COLLD_SERVER_CORE_VERIFY_H
#define COLLD_SERVER_CORE_VERIFY_H

#include "server/core/daemon.h"

#include <stddef.h>
#include <stdint.h>

/* The checksum of a result: XXH3 (64 bits) of its bytes. */
uint64_t colld_verify_sum(const void *p, size_t len);

/* The verdict over n checksums that should be equal: the index whose checksum is the reference
 * (the one a strict majority holds, else the lowest index's; *majority says which), and the
 * number of entries that differ from it (0: all equal). */
int colld_verify_verdict(const uint64_t *sums, int n, int *ref, bool *majority);

/* The index of the first element (of es bytes) at which a and b differ, among count; count when
 * none does. Only for a verdict that failed: it reads both buffers. */
uint64_t colld_verify_first_diff(const void *a, const void *b, uint64_t count, size_t es);

/* The test hook --test-corrupt-result (builds with COLLD_TEST_HOOKS only; never in a release
 * build): "R:E" flips the bits of element E of rank R's verified result (all-reduce, broadcast,
 * all-gather) on this daemon after the collective, before verification; "node:E" flips element E
 * of this node's multi-node result (of those kinds) before its ranks get it. Parsed into *rank (-1 for node, -2 when off) and *elem; false when the
 * text is malformed. */
bool colld_verify_hook_parse(const char *text, int *rank, uint64_t *elem);

/* Whether a collective of this kind is verified: those whose result must be bitwise the same on
 * every rank (all-reduce, broadcast, all-gather). Reduce and reduce-scatter are not: each of their
 * results exists on one rank only (docs/operations.md, "Result verification"). */
static inline bool colld_verify_kind(uint32_t kind)
{
    return kind == COLLD_KIND_ALLREDUCE || kind == COLLD_KIND_BROADCAST || kind == COLLD_KIND_ALLGATHER;
}

/* Whether a communicator's all-reduces are verified: the daemon's --verify-results or a rank's
 * colld_comm_config_t.verify_results (lock held, or fixed once formed). */
static inline bool colld_comm_verifies(const colld_daemon_t *d, const colld_dcomm_t *c)
{
    return d->cfg.verify_results || c->verify;
}

#endif /* COLLD_SERVER_CORE_VERIFY_H */
