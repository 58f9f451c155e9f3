/*
 * redop.c - premultiplied-sum operators (colld_redop_create_premul_sum, colld_redop_destroy): a
 * small table per communicator handle, and the resolution of a collective's op into what goes on
 * the wire (coll.c).
 *
 * An operator is a value of colld_redop_t above every built-in op: the premul bit, the handle's
 * tag (which handle made it), the entry's generation (which life of the entry) and the entry's
 * index:
 *
 *   bit 30: 1 | bits 18..29: tag | bits 6..17: generation | bits 0..5: entry
 *
 * A collective looks its op up here when it is called and copies the entry's scalar word into its
 * descriptor (or its fast-area slot), so the operator is free to go right after. The tag is given
 * by the client at the handle's first operator, from a per-client counter that skips 0 (no
 * operator yet), so an operator of another handle of the same client is recognised as such (until
 * the counter wraps after 4095 handles); one whose entry was destroyed, or destroyed and made
 * again, is recognised by its generation (until that wraps after 4096 lives of the entry).
 */
#include "client/client_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PREMUL_BIT 0x40000000u
#define TAG_SHIFT 18
#define TAG_MASK 0xfffu
#define GEN_SHIFT 6
#define GEN_MASK 0xfffu
#define ENTRY_MASK 0x3fu

_Static_assert(COLLD_REDOP_PREMUL_MAX <= ENTRY_MASK + 1, "entries fit their bits");
_Static_assert(COLLD_REDOP_COUNT < PREMUL_BIT, "operators lie above the built-in ops");

/* One operator entry of a handle. */
struct colld_premul {
    bool live;
    colld_dtype_t dtype;
    uint32_t gen;  /* its generation: bumped when the entry is made again */
    uint64_t word; /* the scalar word (proto/wire.h) */
};

/* The dtype's name, for messages. */
static const char *dtype_name(colld_dtype_t dt)
{
    static const char *const names[COLLD_DTYPE_COUNT] = { "int8",   "uint8",   "int32",    "uint32",  "int64",
                                                          "uint64", "float16", "bfloat16", "float32", "float64" };
    return (unsigned)dt < COLLD_DTYPE_COUNT ? names[dt] : "unknown";
}

/* The operator value of entry i of comm. */
static colld_redop_t op_value(const colld_comm_t *comm, unsigned i)
{
    return (colld_redop_t)(PREMUL_BIT | (comm->premul_tag & TAG_MASK) << TAG_SHIFT |
                           (comm->premul[i].gen & GEN_MASK) << GEN_SHIFT | i);
}

colld_status_t colld_redop_create_premul_sum(colld_comm_t *comm, const void *scalar, colld_dtype_t dtype,
                                             colld_redop_t *op)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    if (!scalar || !op)
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT, "colld_redop_create_premul_sum: %s is NULL",
                                 !scalar ? "scalar" : "op");
    if ((unsigned)dtype >= COLLD_DTYPE_COUNT)
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT, "colld_redop_create_premul_sum: unknown dtype %d",
                                 (int)dtype);
    if (!comm->premul) {
        comm->premul = calloc(COLLD_REDOP_PREMUL_MAX, sizeof(*comm->premul));
        if (!comm->premul)
            return colld__comm_error(comm, COLLD_ERR_NO_MEMORY, "colld_redop_create_premul_sum: out of memory");
        pthread_mutex_lock(&comm->client->mu);
        comm->client->redop_tags = comm->client->redop_tags % TAG_MASK + 1; /* 1 .. 4095 */
        comm->premul_tag = comm->client->redop_tags;
        pthread_mutex_unlock(&comm->client->mu);
    }
    unsigned i = 0;
    while (i < COLLD_REDOP_PREMUL_MAX && comm->premul[i].live)
        i++;
    if (i == COLLD_REDOP_PREMUL_MAX)
        return colld__comm_error(comm, COLLD_ERR_INVALID_USAGE,
                                 "colld_redop_create_premul_sum: this communicator handle (rank %d of %d) already "
                                 "holds %d premultiplied-sum operators; destroy those no longer needed "
                                 "(colld_redop_destroy)",
                                 comm->rank, comm->nranks, COLLD_REDOP_PREMUL_MAX);
    struct colld_premul *e = &comm->premul[i];
    e->live = true;
    e->dtype = dtype;
    e->gen = (e->gen + 1) & GEN_MASK;
    e->word = 0;
    memcpy(&e->word, scalar, colld_dtype_size(dtype));
    *op = op_value(comm, i);
    return COLLD_OK;
}

/* The live entry that `op` names on comm, or NULL with why not in `why`. */
static struct colld_premul *lookup(colld_comm_t *comm, colld_redop_t op, char *why, size_t len)
{
    unsigned v = (unsigned)op, i = v & ENTRY_MASK;
    if ((unsigned)op < COLLD_REDOP_COUNT) {
        snprintf(why, len, "op %d is a built-in op, not a premultiplied-sum operator", (int)op);
        return NULL;
    }
    if ((v & ~(PREMUL_BIT | TAG_MASK << TAG_SHIFT | GEN_MASK << GEN_SHIFT | ENTRY_MASK)) || !(v & PREMUL_BIT) ||
        i >= COLLD_REDOP_PREMUL_MAX) {
        snprintf(why, len, "unknown reduction op %d (0x%x): neither a built-in op nor a premultiplied-sum operator",
                 (int)op, v);
        return NULL;
    }
    if (!comm->premul || (v >> TAG_SHIFT & TAG_MASK) != comm->premul_tag) {
        snprintf(why, len,
                 "reduction op 0x%x is no premultiplied-sum operator of this communicator handle (rank %d of %d): "
                 "it is one of another communicator handle, or a made-up value; make one with "
                 "colld_redop_create_premul_sum on this handle",
                 v, comm->rank, comm->nranks);
        return NULL;
    }
    struct colld_premul *e = &comm->premul[i];
    if (!e->live || (v >> GEN_SHIFT & GEN_MASK) != e->gen) {
        snprintf(why, len, "reduction op 0x%x is a premultiplied-sum operator that was destroyed (colld_redop_destroy)",
                 v);
        return NULL;
    }
    return e;
}

colld_status_t colld_redop_destroy(colld_comm_t *comm, colld_redop_t op)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    char why[256];
    struct colld_premul *e = lookup(comm, op, why, sizeof(why));
    if (!e)
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT, "colld_redop_destroy: %s", why);
    e->live = false;
    e->word = 0;
    return COLLD_OK;
}

colld_status_t colld__redop_resolve(colld_comm_t *comm, colld_redop_t op, colld_dtype_t dtype, uint8_t *wire_op,
                                    uint64_t *scalar)
{
    *scalar = 0;
    if ((unsigned)op < COLLD_REDOP_COUNT) {
        *wire_op = (uint8_t)op;
        return COLLD_OK;
    }
    char why[256];
    struct colld_premul *e = lookup(comm, op, why, sizeof(why));
    if (!e)
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT, "%s", why);
    if (e->dtype != dtype)
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT,
                                 "reduction op 0x%x is a premultiplied sum of %s, but the collective's dtype is %s: "
                                 "make the operator with the collective's dtype",
                                 (unsigned)op, dtype_name(e->dtype), dtype_name(dtype));
    *wire_op = COLLD_REDOP_PREMUL_SUM;
    *scalar = e->word;
    return COLLD_OK;
}
