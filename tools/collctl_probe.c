/*
 * collctl_probe.c - `collctl probe`: measure every link of this node now (issue 18 item 1).
 *
 * The daemon sends --bytes (default 2 MiB) of probe data to each peer daemon that is up and has
 * as much sent back, one peer after the other; each side times what it receives (server/net/
 * probe.c). collctl prints per peer the rate each way and the round trip of a control message,
 * applies the slow-link rule (common/linkhealth.h) to the 2 x peers directed links, and names the
 * slow ones. Exit status 1 when a link is slow or could not be measured, 0 otherwise.
 */
#include "tools/collctl.h"

#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROBE_RPC_TIMEOUT_MS (3600 * 1000) /* the daemon ends each peer's probe after 15 s */

/* A rate from bytes and nanoseconds, 0 when nothing was timed. */
static double rate_of(uint64_t bytes, uint64_t ns)
{
    return bytes && ns ? (double)bytes * 1e9 / (double)ns : 0;
}

int collctl_probe(colld_client_t *c, int json, uint64_t bytes)
{
    Colld__V1__ProbeRequest req = COLLD__V1__PROBE_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(c, &ref);
    req.session = &ref;
    req.bytes = bytes;
    Colld__V1__ProbeResponse *r = NULL;
    char detail[512] = "";
    colld_status_t st = colld__client_rpc(c, "/colld.v1.Colld/Probe", &req.base, &colld__v1__probe_response__descriptor,
                                          PROBE_RPC_TIMEOUT_MS, (ProtobufCMessage **)&r, detail, sizeof(detail));
    if (st != COLLD_OK) {
        colld_str_sanitize(detail, sizeof(detail), detail, SIZE_MAX);
        fprintf(stderr, "collctl: probe failed: %s: %s\n", colld_status_name(st),
                *detail ? detail : colld_status_string(st));
        return 1;
    }
    collctl_clean_message(&r->base);
    /* the node's own name comes from status: the probe answer names the peers only */
    Colld__V1__StatusRequest sreq = COLLD__V1__STATUS_REQUEST__INIT;
    sreq.session = &ref;
    Colld__V1__StatusResponse *s = NULL;
    const char *self = "this node";
    if (collctl_call(c, "status", "/colld.v1.Colld/Status", &sreq.base, &colld__v1__status_response__descriptor,
                     (ProtobufCMessage **)&s) == 0 &&
        *s->node_name)
        self = s->node_name;
    size_t n = COLLD_MIN(r->n_links, (size_t)COLLCTL_MAX_LINKS / 2);
    const char *via[COLLCTL_MAX_LINKS / 2]; /* each link's transport, from status */
    for (size_t i = 0; i < n; i++) {
        via[i] = "tcp";
        for (size_t k = 0; s && k < s->n_peers; k++)
            if (strcmp(s->peers[k]->addr, r->links[i]->addr) == 0 && *s->peers[k]->transport)
                via[i] = s->peers[k]->transport;
    }
    collctl_link_t links[COLLCTL_MAX_LINKS];
    colld_link_rate_t rates[COLLCTL_MAX_LINKS];
    int errors = 0;
    for (size_t i = 0; i < n; i++) {
        const Colld__V1__LinkProbe *p = r->links[i];
        const char *peer = *p->name ? p->name : p->addr;
        links[2 * i] = (collctl_link_t){ .peer = i, .tx = true, .from = self, .to = peer };
        links[2 * i + 1] = (collctl_link_t){ .peer = i, .tx = false, .from = peer, .to = self };
        rates[2 * i] = (colld_link_rate_t){ .rate = rate_of(p->tx_bytes, p->tx_ns) };
        rates[2 * i + 1] = (colld_link_rate_t){ .rate = rate_of(p->rx_bytes, p->rx_ns) };
        errors += *p->error != '\0';
    }
    size_t nslow = colld_link_outliers(rates, 2 * n);
    for (size_t i = 0; i < 2 * n; i++)
        links[i].l = rates[i];
    if (json) {
        printf("{\"schema_version\":%d,\"node\":", COLLCTL_JSON_SCHEMA_VERSION);
        collctl_json_str(self);
        printf(",\"bytes\":%llu,\"links\":[", (unsigned long long)(bytes ? bytes : 0));
        for (size_t i = 0; i < n; i++) {
            const Colld__V1__LinkProbe *p = r->links[i];
            printf("%s{\"peer\":", i ? "," : "");
            collctl_json_str(p->name);
            printf(",\"addr\":");
            collctl_json_str(p->addr);
            printf(",\"transport\":");
            collctl_json_str(via[i]);
            printf(",\"tx_rate\":%.0f,\"rx_rate\":%.0f,\"tx_slow\":%s,\"rx_slow\":%s,\"rtt_ms\":%.3f,\"error\":",
                   rates[2 * i].rate, rates[2 * i + 1].rate, rates[2 * i].slow ? "true" : "false",
                   rates[2 * i + 1].slow ? "true" : "false", (double)p->rtt_ns / 1e6);
            collctl_json_str(p->error);
            printf("}");
        }
        printf("],\"slow_links\":");
        collctl_links_json(links, 2 * n);
        printf("}\n");
    } else {
        printf("links of %s (%zu peer(s)); slow: below 1/%.0f of the median of the other links\n", self, n,
               COLLD_LINK_SLOW_RATIO);
        printf("  %-16s %14s %14s %10s %4s  %s\n", "PEER", "TO-PEER", "FROM-PEER", "RTT", "VIA", "ERROR");
        for (size_t i = 0; i < n; i++) {
            const Colld__V1__LinkProbe *p = r->links[i];
            char tx[40], rx[40];
            colld_link_rate_text(tx, 32, rates[2 * i].rate);
            colld_link_rate_text(rx, 32, rates[2 * i + 1].rate);
            if (rates[2 * i].slow)
                strcat(tx, " SLOW");
            if (rates[2 * i + 1].slow)
                strcat(rx, " SLOW");
            printf("  %-16s %14s %14s %7.2f ms %4s  %s\n", links[2 * i].to, tx, rx, (double)p->rtt_ns / 1e6, via[i],
                   *p->error ? p->error : "-");
        }
        for (size_t i = 0; i < 2 * n; i++)
            if (links[i].l.slow) {
                char text[256];
                colld_link_describe(text, sizeof(text), links[i].from, links[i].to, &links[i].l);
                printf("slow link: %s\n", text);
            }
        if (!nslow && !errors)
            printf("no slow link\n");
    }
    if (s)
        protobuf_c_message_free_unpacked(&s->base, NULL);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return nslow || errors ? 1 : 0;
}
