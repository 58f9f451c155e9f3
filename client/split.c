/*
 * split.c - colld_comm_split: new communicators from the ranks of one, by color and key (NCCL's
 * ncclCommSplit semantics), built from what every communicator already has, so that it works the
 * same on one node and across nodes:
 *
 *   1. an all-gather of every rank's (color, key) on the parent: each rank learns every group;
 *   2. the leader of each color (its rank of lowest (key, parent rank): the new rank 0) makes a
 *      unique id with its own client (colld_get_unique_id; across nodes its daemon is the root);
 *   3. an all-gather of the leaders' unique ids on the parent (128 bytes per rank, zeros from the
 *      others);
 *   4. every rank with a color joins its group's communicator (colld_comm_init_rank) at its place
 *      in (key, parent rank) order.
 *
 * A failure in steps 1-3 is the parent's: every rank gets it. A rank with COLLD_SPLIT_NOCOLOR takes
 * part in 1-3 and gets no communicator.
 */
#include "client/client_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t color, key;
} colorkey_t;

/* Whether parent rank a comes before b in their group: (key, parent rank) order. */
static bool before(const colorkey_t *ck, int a, int b)
{
    return ck[a].key < ck[b].key || (ck[a].key == ck[b].key && a < b);
}

/* An all-gather of `bytes` per rank on the parent, waited for. */
static colld_status_t gather(colld_comm_t *comm, const void *mine, void *all, size_t bytes)
{
    colld_status_t st = colld_allgather(mine, all, bytes, COLLD_UINT8, comm, NULL);
    return st == COLLD_OK ? colld_comm_synchronize(comm) : st;
}

colld_status_t colld_comm_split(colld_comm_t *comm, int color, int key, colld_comm_t **newcomm,
                                const colld_comm_config_t *cfg)
{
    if (!comm || !newcomm)
        return COLLD_ERR_INVALID_ARGUMENT;
    *newcomm = NULL;
    if (color < 0 && color != COLLD_SPLIT_NOCOLOR)
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT,
                                 "colld_comm_split: color %d is negative (COLLD_SPLIT_NOCOLOR is %d)", color,
                                 COLLD_SPLIT_NOCOLOR);
    if (colld__group_active())
        return colld__comm_error(comm, COLLD_ERR_INVALID_USAGE,
                                 "colld_comm_split inside colld_group_start/end: call it outside the group");
    int n = comm->nranks, me = comm->rank;
    colorkey_t *ck = calloc((size_t)n, sizeof(*ck));
    colld_unique_id_t *ids = calloc((size_t)n, sizeof(*ids));
    colld_status_t st = ck && ids ? COLLD_OK : COLLD_ERR_NO_MEMORY;
    colorkey_t mine = { .color = color, .key = key };
    if (st == COLLD_OK)
        st = gather(comm, &mine, ck, sizeof(mine));
    int leader = -1, newrank = 0, newn = 0;
    for (int r = 0; st == COLLD_OK && color != COLLD_SPLIT_NOCOLOR && r < n; r++) {
        if (ck[r].color != color)
            continue;
        newn++;
        if (leader < 0 || before(ck, r, leader))
            leader = r;
        if (before(ck, r, me))
            newrank++;
    }
    colld_unique_id_t id;
    memset(&id, 0, sizeof(id));
    if (st == COLLD_OK && leader == me && (st = colld_get_unique_id(comm->client, &id)) != COLLD_OK)
        colld__comm_error(comm, st, "colld_comm_split: rank %d cannot make the unique id of color %d: %s", me, color,
                          colld_last_error(comm->client));
    /* Every rank takes part in the second all-gather, even after its own failure above: the others
     * would wait for it. A leader that failed sends zeros, which its group refuses at the join. */
    colld_status_t gst = ck && ids ? gather(comm, &id, ids, sizeof(id)) : st;
    st = st != COLLD_OK ? st : gst;
    static const colld_unique_id_t none;
    if (st == COLLD_OK && color != COLLD_SPLIT_NOCOLOR && memcmp(&ids[leader], &none, sizeof(none)) == 0)
        st = colld__comm_error(comm, COLLD_ERR_INVALID_USAGE,
                               "colld_comm_split: rank %d, the first rank of color %d, could not make its unique id",
                               leader, color);
    if (st == COLLD_OK && color != COLLD_SPLIT_NOCOLOR)
        st = colld_comm_init_rank(comm->client, newcomm, newn, ids[leader], newrank, cfg);
    free(ck);
    free(ids);
    return st;
}
