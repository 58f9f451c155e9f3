/*
 * mem.c - colld_mem_alloc and colld_mem_free: memory shared with the daemon, zero copy for
 * collectives. Host memory is a sealed memfd registered over the session socket (conn.c), device
 * memory the CUDA path's (cuda.c).
 */
#include "client/client_internal.h"

#include <stdlib.h>
#include <sys/mman.h>

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
