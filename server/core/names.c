/*
 * names.c - the names of collective kinds, data types, reduction ops and communicator states, as
 * the daemon's messages, collctl and the events write them; and how a detail names a send or
 * receive.
 */
#include "server/core/daemon.h"

#include <stdio.h>

/* "allreduce", ..., "unknown" for a value outside colld_kind_t. */
const char *colld_kind_name(unsigned kind)
{
    switch (kind) {
    case COLLD_KIND_ALLREDUCE:
        return "allreduce";
    case COLLD_KIND_BROADCAST:
        return "broadcast";
    case COLLD_KIND_REDUCE:
        return "reduce";
    case COLLD_KIND_ALLGATHER:
        return "allgather";
    case COLLD_KIND_REDUCESCATTER:
        return "reducescatter";
    case COLLD_KIND_GATHER:
        return "gather";
    case COLLD_KIND_SCATTER:
        return "scatter";
    case COLLD_KIND_ALLTOALL:
        return "alltoall";
    case COLLD_KIND_SEND:
        return "send";
    case COLLD_KIND_RECV:
        return "recv";
    }
    return "unknown";
}

/* "int8", ..., "unknown" for a value outside colld_dtype_t. */
const char *colld_dtype_name(unsigned dtype)
{
    static const char *const names[] = { "int8",   "uint8",   "int32",    "uint32",  "int64",
                                         "uint64", "float16", "bfloat16", "float32", "float64" };
    _Static_assert(sizeof(names) / sizeof(names[0]) == COLLD_DTYPE_COUNT, "one name per dtype");
    return dtype < COLLD_DTYPE_COUNT ? names[dtype] : "unknown";
}

/* "sum", ..., "premul_sum", "unknown" for a value outside the wire's ops (proto/wire.h). */
const char *colld_redop_name(unsigned redop)
{
    static const char *const names[] = { "sum", "prod", "min", "max", "avg", "premul_sum" };
    _Static_assert(sizeof(names) / sizeof(names[0]) == COLLD_WIRE_REDOPS, "one name per op");
    return redop < COLLD_WIRE_REDOPS ? names[redop] : "unknown";
}

/* The name of a state, as collctl and the events show it. */
const char *colld_comm_state_name(colld_comm_state_t s)
{
    switch (s) {
    case COLLD_COMM_JOINING:
        return "joining";
    case COLLD_COMM_READY:
        return "ready";
    case COLLD_COMM_BROKEN:
        return "broken";
    case COLLD_COMM_CLOSING:
        return "closing";
    }
    return "unknown";
}

int colld_p2p_op_text(char *buf, size_t len, const char *verb, bool send, const char *what, int peer, uint64_t id)
{
    return snprintf(buf, len, "%s%s%s %s rank %d (operation #%llu)", verb, what ? " " : "", what ? what : "",
                    send ? "to" : "from", peer, (unsigned long long)id);
}
