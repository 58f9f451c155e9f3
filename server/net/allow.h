/*
 * allow.h - the peer daemons an operator lets this daemon dial for its tenants (--peers): a
 * list of HOST:PORT, ADDR/PREFIX:PORT and *:PORT entries, PORT a number or * (any). A tenant's
 * unique id names its root daemon's address; the daemon dials it only when it is on this list or
 * is a daemon that proved the cluster secret to it (cluster.c, "Who is dialed").
 */
#ifndef COLLD_SERVER_NET_ALLOW_H
#define COLLD_SERVER_NET_ALLOW_H

#include <stdbool.h>
#include <stddef.h>

typedef struct colld_peer_allow colld_peer_allow_t;

/* Parse --peers (NULL or "" gives an empty list). Returns 0 with *out (free it with
 * colld_peer_allow_free), or -1 with the reason in err; then there is nothing to free. */
int colld_peer_allow_parse(const char *text, colld_peer_allow_t **out, char *err, size_t err_len);
void colld_peer_allow_free(colld_peer_allow_t *a);
/* Whether addr ("HOST:PORT" or "[V6]:PORT", as colld_net_check_addr accepts) is on the list. An
 * address literal matches entries of the same family whose network holds it; a host name matches
 * only the same name (names are not resolved here). NULL-safe (an empty list matches nothing). */
bool colld_peer_allow_match(const colld_peer_allow_t *a, const char *addr);
/* Entries on the list. */
size_t colld_peer_allow_count(const colld_peer_allow_t *a);

#endif /* COLLD_SERVER_NET_ALLOW_H */
