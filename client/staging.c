/*
 * staging.c - collectives on any pointer: memory that did not come from colld_mem_alloc is
 * staged through regions shared with the daemon.
 *
 * A send buffer outside every registration is copied into a staging region when the collective
 * is posted; a receive buffer outside every registration gets a staging region that is copied
 * back into it when the completion is reaped (by whichever call observes it: synchronize, query,
 * get_async_error). Overlapping send and receive ranges (in-place, also all-gather's and
 * reduce-scatter's slice forms) share one staged region covering both, so the daemon still sees
 * an in-place collective. Staging regions are ordinary registrations, cached per client for
 * reuse (up to STAGE_CACHE_BYTES) so steady traffic makes no system call. Why staging rather
 * than cross-memory attach: docs/any-pointer.md.
 */
#include "client/client_internal.h"

#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define STAGE_CACHE_BYTES (256u << 20)
#define STAGE_MIN_BYTES 4096u

struct colld_stage {
    void *base;
    size_t size;
    uint32_t reg_id;
    struct colld_stage *next;
};

/* ============================================================================================
 * Staging regions
 * ========================================================================================== */

/* A region of at least `bytes`: a cached one no more than 4x too big (counting a page as the
 * smallest size), else a new registration. */
static colld_status_t stage_get(colld_client_t *c, size_t bytes, colld_stage_t **out, colld_err_t *err)
{
    size_t floor_bytes = bytes < STAGE_MIN_BYTES ? STAGE_MIN_BYTES : bytes;
    pthread_mutex_lock(&c->mu);
    for (colld_stage_t **pp = &c->stage_cache; *pp; pp = &(*pp)->next) {
        colld_stage_t *s = *pp;
        if (s->size >= bytes && s->size / 4 <= floor_bytes) {
            *pp = s->next;
            c->stage_cached -= s->size;
            pthread_mutex_unlock(&c->mu);
            *out = s;
            return COLLD_OK;
        }
    }
    pthread_mutex_unlock(&c->mu);
    colld_stage_t *s = calloc(1, sizeof(*s));
    if (!s) {
        return colld_err_set(err, COLLD_ERR_NO_MEMORY, "out of memory");
    }
    colld_status_t st = colld__register(c, bytes, &s->base, &s->size, &s->reg_id, err);
    if (st != COLLD_OK) {
        free(s);
        return st;
    }
    *out = s;
    return COLLD_OK;
}

/* Give a region back to the front of the cache (most recently used first); when the cache is
 * over its budget the least recently used regions move to the list to unregister (which needs the
 * session socket, not to be used under mu). mu held. */
static void stage_put(colld_client_t *c, colld_stage_t *s)
{
    if (!s)
        return;
    s->next = c->stage_cache;
    c->stage_cache = s;
    c->stage_cached += s->size;
    while (c->stage_cached > STAGE_CACHE_BYTES) {
        colld_stage_t **pp = &c->stage_cache;
        while ((*pp)->next)
            pp = &(*pp)->next;
        colld_stage_t *old = *pp;
        *pp = NULL;
        c->stage_cached -= old->size;
        old->next = c->stage_trash;
        c->stage_trash = old;
    }
}

/* Unregister and unmap a list of regions. */
static void stage_destroy_list(colld_client_t *c, colld_stage_t *s)
{
    while (s) {
        colld_stage_t *next = s->next;
        colld__deregister(c, s->reg_id);
        munmap(s->base, s->size);
        free(s);
        s = next;
    }
}

/* Unregister the regions the cache could not keep (outside mu). */
void colld__stage_trim(colld_client_t *c)
{
    pthread_mutex_lock(&c->mu);
    colld_stage_t *trash = c->stage_trash;
    c->stage_trash = NULL;
    pthread_mutex_unlock(&c->mu);
    stage_destroy_list(c, trash);
}

/* At disconnect: every cached and discarded region. */
void colld__stage_free_all(colld_client_t *c)
{
    stage_destroy_list(c, c->stage_cache);
    stage_destroy_list(c, c->stage_trash);
    c->stage_cache = c->stage_trash = NULL;
    c->stage_cached = 0;
}

/* ============================================================================================
 * Pending copy-outs
 * ========================================================================================== */

/* Release a pending record's regions (mu held). */
void colld__pending_release(colld_client_t *c, colld_pending_t *p)
{
    if (!p)
        return;
    stage_put(c, p->stage[0]);
    stage_put(c, p->stage[1]);
    free(p);
}

/* Number a pending record with its collective's sequence number and queue it (mu held). */
void colld__pending_attach(colld_comm_t *comm, colld_pending_t *p, uint64_t seq)
{
    p->seq = seq;
    p->next = NULL;
    colld_pending_t **pp = &comm->pending;
    while (*pp)
        pp = &(*pp)->next;
    *pp = p;
}

/* Unqueue a pending record whose collective was never posted (mu held). */
void colld__pending_detach(colld_comm_t *comm, colld_pending_t *p)
{
    for (colld_pending_t **pp = &comm->pending; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            return;
        }
}

/* A completion arrived: copy the staged result out if it succeeded, release the regions (mu
 * held, called from reap). */
void colld__pending_complete(colld_client_t *c, colld_comm_t *comm, uint64_t seq, colld_status_t st)
{
    for (colld_pending_t **pp = &comm->pending; *pp; pp = &(*pp)->next) {
        colld_pending_t *p = *pp;
        if (p->seq != seq)
            continue;
        *pp = p->next;
        if (st == COLLD_OK && p->bytes)
            memcpy(p->user, p->from, p->bytes);
        colld__pending_release(c, p);
        return;
    }
}

/* Drop every pending record of a communicator (destroy; mu held). */
void colld__pending_drop_all(colld_client_t *c, colld_comm_t *comm)
{
    while (comm->pending) {
        colld_pending_t *p = comm->pending;
        comm->pending = p->next;
        colld__pending_release(c, p);
    }
}

/* ============================================================================================
 * Resolving a collective's buffers
 * ========================================================================================== */

colld_status_t colld__stage(colld_comm_t *comm, const void *send, size_t send_bytes, void *recv, size_t recv_bytes,
                            int ls, int lr, colld_wire_buf_t *wsend, colld_wire_buf_t *wrecv, colld_pending_t **pending,
                            colld_err_t *err)
{
    colld_client_t *c = comm->client;
    colld_status_t st = COLLD_OK;
    colld_pending_t *p = NULL;
    colld_err_t reg_err = COLLD_ERR_INIT;
    *pending = NULL;
    if (ls == 0 && lr == 0) {
        atomic_fetch_add_explicit(&c->zero_copy_ops, 1, memory_order_relaxed);
        return COLLD_OK; /* zero copy */
    }
    colld__stage_trim(c);
    p = calloc(1, sizeof(*p));
    if (!p)
        return COLLD_ERR_NO_MEMORY;
    uintptr_t s0 = (uintptr_t)send, s1 = s0 + send_bytes, r0 = (uintptr_t)recv, r1 = r0 + recv_bytes;
    bool overlap = send_bytes && recv_bytes && s0 < r1 && r0 < s1;
    size_t copied = 0; /* into staging regions now (what is copied out later is p->bytes) */
    if (overlap) {
        /* One region covering both ranges keeps the collective in place for the daemon. */
        uintptr_t u0 = s0 < r0 ? s0 : r0, u1 = s1 > r1 ? s1 : r1;
        if ((st = stage_get(c, u1 - u0, &p->stage[0], &reg_err)) != COLLD_OK)
            goto fail;
        memcpy(p->stage[0]->base, (const void *)u0, u1 - u0);
        copied = u1 - u0;
        *wsend = (colld_wire_buf_t){ .reg_id = p->stage[0]->reg_id, .offset = s0 - u0 };
        *wrecv = (colld_wire_buf_t){ .reg_id = p->stage[0]->reg_id, .offset = r0 - u0 };
        p->from = (char *)p->stage[0]->base + (r0 - u0);
    } else {
        if (ls == -1) {
            if ((st = stage_get(c, send_bytes, &p->stage[0], &reg_err)) != COLLD_OK)
                goto fail;
            memcpy(p->stage[0]->base, send, send_bytes);
            copied = send_bytes;
            *wsend = (colld_wire_buf_t){ .reg_id = p->stage[0]->reg_id, .offset = 0 };
        }
        if (lr == -1) {
            if ((st = stage_get(c, recv_bytes, &p->stage[1], &reg_err)) != COLLD_OK)
                goto fail;
            *wrecv = (colld_wire_buf_t){ .reg_id = p->stage[1]->reg_id, .offset = 0 };
            p->from = p->stage[1]->base;
        }
    }
    if (p->from) {
        p->user = recv;
        p->bytes = recv_bytes;
    }
    atomic_fetch_add_explicit(&c->staged_ops, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->staged_bytes, copied + p->bytes, memory_order_relaxed);
    *pending = p;
    return COLLD_OK;
fail:
    (void)colld_err_set(err, st, "cannot stage a buffer that is not from colld_mem_alloc: %.*s",
                        (int)(COLLD_CLIENT_DETAIL_LEN / 2), reg_err.msg[0] ? reg_err.msg : colld_status_string(st));
    pthread_mutex_lock(&c->mu);
    colld__pending_release(c, p);
    pthread_mutex_unlock(&c->mu);
    return st;
}
