/*
 * links.c - the slow-link watch (issue 18 item 1): once a second the network thread applies the
 * slow-link rule (common/linkhealth.h) to this node's measured links (the transport's rates, the
 * same numbers collctl status and the metrics show). A link that becomes slow is logged and
 * recorded as a "slow_link" event naming it, its rate, the other links' range and the
 * multi-node communicators that run over it (so a collective that is slow because of one link
 * says so in the event stream and collctl doctor's recent faults), and while it is slow every
 * communicator over it carries its description (colld_dcomm_t.slow_link), which the flight
 * recorder notes on the collectives that finish meanwhile (collctl trace); a slow link that recovers is
 * recorded as "link_recovered". At most COLLD_LINKS_WATCH_MAX slow links are tracked at once;
 * beyond that new ones are still in status and the metrics, not in events.
 */
#include "server/net/cluster.h"

#include "server/observability/events.h"
#include "common/linkhealth.h"
#include "common/log.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LINKS_WATCH_MS 1000

/* The multi-node communicators spanning the node at addr, as " (communicators 3, 5)" (lock held). */
static void comms_over(colld_daemon_t *d, const char *addr, char *buf, size_t len)
{
    int off = 0, n = 0;
    buf[0] = '\0';
    for (colld_dcomm_t *c = d->comms; c && off < (int)len - 24; c = c->next) {
        const colld_xcomm_t *x = colld_xcomm(c);
        if (!x || !x->formed || c->state != COLLD_COMM_READY)
            continue;
        for (int i = 0; i < x->nnodes; i++)
            if (i != x->self && strcmp(x->node_addr[i], addr) == 0) {
                off += snprintf(buf + off, len - (size_t)off, "%s%llu",
                                n++ ? ", " : "; communicators over it: ", (unsigned long long)c->id);
                break;
            }
    }
}

/* Mark the multi-node communicators spanning the node at addr as running over the slow link
 * `text`, unless one is marked already (lock held). */
static void mark_comms(colld_daemon_t *d, const char *addr, const char *text)
{
    for (colld_dcomm_t *c = d->comms; c; c = c->next) {
        const colld_xcomm_t *x = colld_xcomm(c);
        if (!x || !x->formed || c->slow_link[0])
            continue;
        for (int i = 0; i < x->nnodes; i++)
            if (i != x->self && strcmp(x->node_addr[i], addr) == 0) {
                colld_strlcpy(c->slow_link, text, sizeof(c->slow_link));
                break;
            }
    }
}

/* Whether (addr, tx) is in the watch list; with add/remove, change it. Returns the old state. */
static bool watch_has(colld_cluster_t *cl, const char *addr, bool tx, int change)
{
    for (int i = 0; i < COLLD_LINKS_WATCH_MAX; i++) {
        cwatch_t *w = &cl->slow[i];
        if (w->used && w->tx == tx && strcmp(w->addr, addr) == 0) {
            if (change < 0)
                w->used = false;
            return true;
        }
    }
    for (int i = 0; change > 0 && i < COLLD_LINKS_WATCH_MAX; i++)
        if (!cl->slow[i].used) {
            cl->slow[i] = (cwatch_t){ .used = true, .tx = tx };
            colld_strlcpy(cl->slow[i].addr, addr, sizeof(cl->slow[i].addr));
            break;
        }
    return false;
}

void colld_links_tick(colld_daemon_t *d)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    uint64_t now = colld_now_ms();
    if (now < cl->links_next_ms)
        return;
    cl->links_next_ms = now + LINKS_WATCH_MS;
    size_t max = colld_net_peers(cl->net, NULL, 0); /* the count; only this thread adds peers */
    colld_net_peer_info_t *p = calloc(max + 1, sizeof(*p));
    size_t n = p ? COLLD_MIN(colld_net_peers(cl->net, p, max), max) : 0;
    colld_link_rate_t *l = calloc(2 * n + 1, sizeof(*l));
    if (!p || !l)
        goto out;
    for (size_t i = 0; i < n; i++) {
        bool up = strcmp(p[i].state, "up") == 0;
        l[2 * i].rate = up ? p[i].tx_rate : 0;
        l[2 * i + 1].rate = up ? p[i].rx_rate : 0;
    }
    colld_link_outliers(l, 2 * n);
    pthread_mutex_lock(&d->lock);
    for (colld_dcomm_t *c = d->comms; c; c = c->next) /* marked again below while still slow */
        c->slow_link[0] = '\0';
    for (size_t k = 0; k < 2 * n; k++) {
        const colld_net_peer_info_t *x = &p[k / 2];
        bool tx = k % 2 == 0;
        const char *peer = x->name[0] ? x->name : x->addr;
        char text[256], over[256];
        if (l[k].slow) {
            colld_link_describe(text, sizeof(text), tx ? cl->node_name : peer, tx ? peer : cl->node_name, &l[k]);
            mark_comms(d, x->addr, text);
        }
        if (l[k].slow && !watch_has(cl, x->addr, tx, +1)) {
            comms_over(d, x->addr, over, sizeof(over));
            LOG_WARN(NET, "slow link: %s%s", text, over);
            colld_event(d, "slow_link", NULL, -1, 0, 0, 0, COLLD_OK, "%s%s", text, over);
        } else if (!l[k].slow && l[k].rate > 0 && watch_has(cl, x->addr, tx, -1)) {
            char rate[32];
            colld_link_rate_text(rate, sizeof(rate), l[k].rate);
            LOG_INFO(NET, "link %s \u2192 %s recovered: %s", tx ? cl->node_name : peer, tx ? peer : cl->node_name,
                     rate);
            colld_event(d, "link_recovered", NULL, -1, 0, 0, 0, COLLD_OK, "%s \u2192 %s: %s", tx ? cl->node_name : peer,
                        tx ? peer : cl->node_name, rate);
        }
    }
    pthread_mutex_unlock(&d->lock);
out:
    free(p);
    free(l);
}
