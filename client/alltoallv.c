/*
 * alltoallv.c - colld_alltoallv: all-to-all with per-peer counts, built as one group of sends and
 * receives (one of each per peer, this rank included), which the daemon runs concurrently and
 * matches pairwise (server/core/p2p.c). A send and receive are posted for every peer even when
 * the count is 0, so that two ranks that disagree about a count get COLLD_ERR_MISMATCH naming both
 * calls rather than a time-out.
 */
#include "client/client_internal.h"

#include <stdint.h>

/* The byte extent [*lo, *hi) of n regions of counts[q] elements at displs[q] elements. Returns
 * false when one overflows. */
static bool extent(const size_t *counts, const size_t *displs, int n, size_t es, uintptr_t base, uintptr_t *lo,
                   uintptr_t *hi)
{
    *lo = UINTPTR_MAX;
    *hi = 0;
    for (int q = 0; q < n; q++) {
        size_t first, bytes, end;
        if (__builtin_mul_overflow(displs[q], es, &first) || __builtin_mul_overflow(counts[q], es, &bytes) ||
            __builtin_add_overflow(first, bytes, &end) || __builtin_add_overflow(base, end, &end))
            return false;
        if (!bytes)
            continue;
        *lo = base + first < *lo ? base + first : *lo;
        *hi = end > *hi ? end : *hi;
    }
    return true;
}

colld_status_t colld_alltoallv(const void *sendbuf, const size_t *sendcounts, const size_t *sdispls, void *recvbuf,
                               const size_t *recvcounts, const size_t *rdispls, colld_dtype_t dtype, colld_comm_t *comm,
                               void *stream)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    if (!sendcounts || !sdispls || !recvcounts || !rdispls)
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT,
                                 "colld_alltoallv: sendcounts, sdispls, recvcounts and rdispls must not be NULL");
    size_t es = colld_dtype_size(dtype);
    if (!es)
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT, "unknown dtype %d", (int)dtype);
    uintptr_t slo, shi, rlo, rhi;
    if (!extent(sendcounts, sdispls, comm->nranks, es, (uintptr_t)sendbuf, &slo, &shi) ||
        !extent(recvcounts, rdispls, comm->nranks, es, (uintptr_t)recvbuf, &rlo, &rhi))
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT,
                                 "colld_alltoallv: a count or displacement overflows the address space");
    if ((!sendbuf && slo < shi) || (!recvbuf && rlo < rhi))
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT,
                                 "colld_alltoallv: %s is NULL but its counts are not all 0",
                                 !sendbuf && slo < shi ? "sendbuf" : "recvbuf");
    if (slo < shi && rlo < rhi && slo < rhi && rlo < shi)
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT,
                                 "colld_alltoallv: the send regions (%p..%p) and the receive regions (%p..%p) "
                                 "overlap: all-to-all has no in-place form",
                                 (void *)slo, (void *)shi, (void *)rlo, (void *)rhi);
    colld_status_t st = colld_group_start();
    for (int q = 0; q < comm->nranks && st == COLLD_OK; q++) {
        /* An empty region may sit at any displacement of any pointer, NULL included. */
        const void *s = sendcounts[q] ? (const void *)((uintptr_t)sendbuf + sdispls[q] * es) : sendbuf;
        void *r = recvcounts[q] ? (void *)((uintptr_t)recvbuf + rdispls[q] * es) : recvbuf;
        st = colld_send(s, sendcounts[q], dtype, q, comm, stream);
        if (st == COLLD_OK)
            st = colld_recv(r, recvcounts[q], dtype, q, comm, stream);
    }
    /* A failed call poisoned the group (nothing is posted at its end) and returned its error. */
    colld_status_t end = colld_group_end();
    return st != COLLD_OK ? st : end;
}
