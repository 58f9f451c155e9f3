/*
 * mem.c - colld_mem_alloc and colld_mem_free: memory shared with the daemon, zero copy for
 * collectives. Host memory is a sealed memfd registered over the session socket (conn.c), device
 * memory the CUDA path's (cuda.c). And colld_mem_register / colld_mem_deregister (as NCCL's
 * ncclCommRegister / ncclCommDeregister): a registration made up front and held until released.
 */
#include "client/client_internal.h"

#include "common/log.h"

#include <stdlib.h>
#include <sys/mman.h>

/* A colld_mem_register handle: what it registered, for which communicator. Handles are kept in
 * their client's list (c->mu) and looked up by address, never dereferenced before they are found
 * there, so an unknown or already deregistered handle is refused, not followed. */
struct colld_mem_handle {
    colld_comm_t *comm;
    const void *buf;
    size_t bytes;
    bool device;     /* else host memory from colld_mem_alloc: nothing to pin */
    uint32_t reg_id; /* device: the registration it pins (cuda.c) */
    struct colld_mem_handle *next;
};

/* Allocate memory shared with the daemon (see colld.h). */
colld_status_t colld_mem_alloc(colld_client_t *c, void **ptr, size_t bytes, colld_memtype_t type)
{
    if (!c)
        return COLLD_ERR_INVALID_ARGUMENT;
    if (!ptr || bytes == 0)
        return colld__client_error(c, COLLD_ERR_INVALID_ARGUMENT, "colld_mem_alloc: %s",
                                   !ptr ? "ptr is NULL" : "0 bytes");
    *ptr = NULL;
    colld_err_t err = COLLD_ERR_INIT;
    if (type == COLLD_MEM_CUDA) {
        colld_status_t st = colld__gpu_mem_alloc(c, ptr, bytes, &err);
        return st == COLLD_OK
                   ? st
                   : colld__client_error(c, st, "colld_mem_alloc(%zu bytes, COLLD_MEM_CUDA): %s", bytes, err.msg);
    }
    if (type != COLLD_MEM_HOST)
        return colld__client_error(c, COLLD_ERR_INVALID_ARGUMENT, "colld_mem_alloc: unknown memory type %d", (int)type);
    void *base;
    size_t size;
    uint32_t reg_id;
    colld_status_t st = colld__register(c, bytes, &base, &size, &reg_id, &err);
    if (st != COLLD_OK)
        return colld__client_error(c, st, "colld_mem_alloc(%zu bytes, COLLD_MEM_HOST): %s", bytes, err.msg);
    pthread_mutex_lock(&c->mu);
    if (c->nregs == c->cap_regs) {
        size_t n = c->cap_regs ? c->cap_regs * 2 : 16;
        colld_client_reg_t *t = realloc(c->regs, n * sizeof(*t));
        if (!t) {
            pthread_mutex_unlock(&c->mu);
            colld__deregister(c, reg_id);
            munmap(base, size);
            return COLLD_ERR_NO_MEMORY;
        }
        c->regs = t;
        c->cap_regs = n;
    }
    c->regs[c->nregs++] = (colld_client_reg_t){ .base = base, .size = size, .bytes = bytes, .reg_id = reg_id };
    pthread_mutex_unlock(&c->mu);
    *ptr = base;
    return COLLD_OK;
}

/* Free it: deregistered (the daemon keeps its mapping until no operation uses it), unmapped. */
colld_status_t colld_mem_free(colld_client_t *c, void *ptr)
{
    if (!c || !ptr)
        return COLLD_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&c->mu);
    size_t i = 0;
    while (i < c->nregs && c->regs[i].base != ptr)
        i++;
    if (i == c->nregs) {
        pthread_mutex_unlock(&c->mu);
        colld_err_t err = COLLD_ERR_INIT;
        colld_status_t st = colld__gpu_mem_free(c, ptr, &err); /* GPU memory, or not ours */
        return st == COLLD_OK ? st : colld__client_error(c, st, "colld_mem_free: %s", err.msg);
    }
    colld_client_reg_t reg = c->regs[i];
    c->regs[i] = c->regs[--c->nregs];
    pthread_mutex_unlock(&c->mu);
    colld_status_t st = colld__deregister(c, reg.reg_id);
    munmap(reg.base, reg.size);
    return st;
}

/* Is [buf, buf + bytes) inside memory of c from colld_mem_alloc(COLLD_MEM_HOST)? (mu held) */
static bool host_shared(const colld_client_t *c, const void *buf, size_t bytes)
{
    uintptr_t a = (uintptr_t)buf;
    for (size_t i = 0; i < c->nregs; i++) {
        uintptr_t base = (uintptr_t)c->regs[i].base;
        if (a >= base && a - base < c->regs[i].bytes && bytes <= c->regs[i].bytes - (a - base))
            return true;
    }
    return false;
}

colld_status_t colld_mem_register(colld_comm_t *comm, void *buf, size_t bytes, void **handle)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    colld_client_t *c = comm->client;
    if (handle)
        *handle = NULL;
    if (!buf || !handle || bytes == 0)
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT, "colld_mem_register: %s",
                                 !buf      ? "buf is NULL"
                                 : !handle ? "handle is NULL"
                                           : "0 bytes");
    struct colld_mem_handle *h = calloc(1, sizeof(*h));
    if (!h)
        return colld__comm_error(comm, COLLD_ERR_NO_MEMORY, "colld_mem_register: out of memory");
    *h = (struct colld_mem_handle){ .comm = comm, .buf = buf, .bytes = bytes };
    colld_err_t err = COLLD_ERR_INIT;
    colld_status_t st = COLLD_OK;
    pthread_mutex_lock(&c->mu);
    bool host = host_shared(c, buf, bytes);
    pthread_mutex_unlock(&c->mu);
    if (!host && colld__gpu_maybe_device(c) && colld__gpu_is_device(c, buf)) {
        h->device = true;
        st = colld__gpu_mem_register(c, buf, bytes, &h->reg_id, &err);
    } else if (!host) {
        st = colld_err_set(&err, COLLD_ERR_NOT_SUPPORTED,
                           "%p is host memory that is not from colld_mem_alloc: it cannot be shared with the daemon "
                           "(collectives on it are staged, registered or not); allocate it with "
                           "colld_mem_alloc(COLLD_MEM_HOST) for zero copy",
                           buf);
    }
    if (st != COLLD_OK) {
        free(h);
        return colld__comm_error(comm, st, "colld_mem_register(%p, %zu bytes): %s", buf, bytes, err.msg);
    }
    pthread_mutex_lock(&c->mu);
    h->next = c->mem_handles;
    c->mem_handles = h;
    pthread_mutex_unlock(&c->mu);
    *handle = h;
    return COLLD_OK;
}

/* Release what a handle taken off the list registered, and the handle. */
static colld_status_t handle_release(colld_client_t *c, struct colld_mem_handle *h, colld_err_t *err)
{
    colld_status_t st = COLLD_OK;
    if (h->device) {
        /* A collective posted before may name the registration: the daemon takes its own reference
         * when it takes the descriptor, which this waits for. */
        if (!colld__ring_wait_taken(c, COLLD_CLIENT_RPC_TIMEOUT_MS))
            return colld_err_set(err, COLLD_ERR_TIMEOUT,
                                 "colld has not taken the collectives posted before the deregistration within %d ms",
                                 COLLD_CLIENT_RPC_TIMEOUT_MS);
        st = colld__gpu_mem_deregister(c, h->reg_id, err);
    }
    free(h);
    return st;
}

/* Take comm's handle h off the client's list (mu held); false when it is not there. */
static bool handle_take(colld_client_t *c, colld_comm_t *comm, const void *h)
{
    for (struct colld_mem_handle **pp = &c->mem_handles; *pp; pp = &(*pp)->next)
        if (*pp == h && (*pp)->comm == comm) {
            *pp = (*pp)->next;
            return true;
        }
    return false;
}

colld_status_t colld_mem_deregister(colld_comm_t *comm, void *handle)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    colld_client_t *c = comm->client;
    if (!handle)
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT, "colld_mem_deregister: handle is NULL");
    pthread_mutex_lock(&c->mu);
    bool found = handle_take(c, comm, handle);
    pthread_mutex_unlock(&c->mu);
    if (!found)
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT,
                                 "colld_mem_deregister: %p is not a registration of this communicator (never "
                                 "registered with it, or deregistered already)",
                                 handle);
    colld_err_t err = COLLD_ERR_INIT;
    colld_status_t st = handle_release(c, handle, &err);
    return st == COLLD_OK ? st : colld__comm_error(comm, st, "colld_mem_deregister: %s", err.msg);
}

void colld__mem_comm_destroyed(colld_comm_t *comm)
{
    colld_client_t *c = comm->client;
    for (;;) {
        struct colld_mem_handle *h = NULL;
        pthread_mutex_lock(&c->mu);
        for (struct colld_mem_handle *x = c->mem_handles; x && !h; x = x->next)
            if (x->comm == comm)
                h = x;
        if (h)
            handle_take(c, comm, h);
        pthread_mutex_unlock(&c->mu);
        if (!h)
            return;
        colld_err_t err = COLLD_ERR_INIT;
        if (handle_release(c, h, &err) != COLLD_OK)
            LOG_WARN(CLIENT, "colld_comm_destroy: a registration left by colld_mem_register: %s", err.msg);
    }
}

void colld__mem_client_free(colld_client_t *c)
{
    while (c->mem_handles) { /* their registrations go with the GPU state's (colld__gpu_client_free) */
        struct colld_mem_handle *h = c->mem_handles;
        c->mem_handles = h->next;
        free(h);
    }
}
