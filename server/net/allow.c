/*
 * allow.c - the peers an operator lets this daemon dial (allow.h): --peers parsed once at start,
 * matched against the root daemon's address of every multi-node unique id a tenant brings.
 */
#include "server/net/allow.h"

#include "common/util.h"
#include "transport/tcp/tcp.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define ALLOW_MAX_ENTRIES 256

typedef struct {
    int family;       /* AF_INET, AF_INET6; 0: a host name; -1: any host ("*") */
    uint8_t net[16];  /* the address (network) */
    int prefix;       /* leading bits that must match */
    char name[COLLD_NET_ADDR_LEN];
    int port;         /* -1: any */
} allow_entry_t;

struct colld_peer_allow {
    size_t n;
    allow_entry_t e[];
};

/* Split "HOST:PORT" or "[HOST]:PORT" into host (brackets dropped) and port text. Returns 0 or -1. */
static int split(const char *s, char *host, size_t hlen, char *port, size_t plen)
{
    const char *colon;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':' || (size_t)(close - s - 1) >= hlen)
            return -1;
        memcpy(host, s + 1, (size_t)(close - s - 1));
        host[close - s - 1] = '\0';
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || (size_t)(colon - s) >= hlen || memchr(s, ':', (size_t)(colon - s)))
            return -1;
        memcpy(host, s, (size_t)(colon - s));
        host[colon - s] = '\0';
    }
    if (strlen(colon + 1) >= plen)
        return -1;
    strcpy(port, colon + 1);
    return host[0] ? 0 : -1;
}

/* A port, or "*" (-1). Returns -2 when it is neither. */
static int parse_port(const char *p)
{
    if (strcmp(p, "*") == 0)
        return -1;
    if (!*p || strspn(p, "0123456789") != strlen(p) || strlen(p) > 5)
        return -2;
    int v = atoi(p);
    return v >= 1 && v <= 65535 ? v : -2;
}

/* An address literal into bytes: its family, or 0 when it is not one. */
static int parse_ip(const char *host, uint8_t out[16])
{
    if (inet_pton(AF_INET, host, out) == 1)
        return AF_INET;
    if (inet_pton(AF_INET6, host, out) == 1)
        return AF_INET6;
    return 0;
}

/* One entry (trimmed, NUL-terminated). Returns 0 or -1 with err. */
static int parse_entry(const char *text, allow_entry_t *e, char *err, size_t err_len)
{
    char host[COLLD_NET_ADDR_LEN], port[16];
    memset(e, 0, sizeof(*e));
    if (split(text, host, sizeof(host), port, sizeof(port)) < 0 || (e->port = parse_port(port)) == -2) {
        colld_set_err(err, err_len,
                      "--peers: '%s' is not HOST:PORT, ADDR/PREFIX:PORT or *:PORT (PORT 1-65535 or *; IPv6 as "
                      "[fd00::/64]:7070)",
                      text);
        return -1;
    }
    if (strcmp(host, "*") == 0) {
        e->family = -1;
        return 0;
    }
    char *slash = strchr(host, '/');
    if (slash)
        *slash = '\0';
    e->family = parse_ip(host, e->net);
    int bits = e->family == AF_INET ? 32 : 128;
    if (!e->family) {
        char check[COLLD_NET_ADDR_LEN + 8];
        snprintf(check, sizeof(check), "%s:1", host);
        if (slash || colld_net_check_addr(check, NULL, 0) < 0) {
            colld_set_err(err, err_len, "--peers: '%s': %s", text,
                          slash ? "a network needs an address (10.0.0.0/8), not a host name"
                                : "not a host name or an address");
            return -1;
        }
        colld_strlcpy(e->name, host, sizeof(e->name));
        return 0;
    }
    e->prefix = bits;
    if (slash) {
        const char *p = slash + 1;
        if (!*p || strspn(p, "0123456789") != strlen(p) || strlen(p) > 3 || atoi(p) > bits) {
            colld_set_err(err, err_len, "--peers: '%s': the prefix must be 0 to %d", text, bits);
            return -1;
        }
        e->prefix = atoi(p);
    }
    return 0;
}

int colld_peer_allow_parse(const char *text, colld_peer_allow_t **out, char *err, size_t err_len)
{
    size_t n = 0, len = text ? strlen(text) : 0;
    colld_peer_allow_t *a = calloc(1, sizeof(*a) + ALLOW_MAX_ENTRIES * sizeof(allow_entry_t));
    char *copy = malloc(len + 1);
    int rc = -1;
    if (!a || !copy) {
        colld_set_err(err, err_len, "--peers: out of memory");
        goto out;
    }
    memcpy(copy, text ? text : "", len + 1);
    for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*tok))
            tok++;
        for (char *endp = tok + strlen(tok); endp > tok && isspace((unsigned char)endp[-1]);)
            *--endp = '\0';
        if (!*tok)
            continue;
        if (n == ALLOW_MAX_ENTRIES) {
            colld_set_err(err, err_len, "--peers: more than %d entries (use networks: 10.0.0.0/16:7070)",
                          ALLOW_MAX_ENTRIES);
            goto out;
        }
        if (parse_entry(tok, &a->e[n], err, err_len) < 0)
            goto out;
        n++;
    }
    a->n = n;
    *out = a;
    a = NULL;
    rc = 0;
out:
    free(copy);
    free(a);
    return rc;
}

void colld_peer_allow_free(colld_peer_allow_t *a)
{
    free(a);
}

size_t colld_peer_allow_count(const colld_peer_allow_t *a)
{
    return a ? a->n : 0;
}

/* Whether the first `bits` bits of a and b are equal. */
static bool same_prefix(const uint8_t *a, const uint8_t *b, int bits)
{
    int whole = bits / 8, rest = bits % 8;
    if (memcmp(a, b, (size_t)whole) != 0)
        return false;
    return !rest || ((a[whole] ^ b[whole]) & (uint8_t)(0xff << (8 - rest))) == 0;
}

bool colld_peer_allow_match(const colld_peer_allow_t *a, const char *addr)
{
    char host[COLLD_NET_ADDR_LEN], port_text[16];
    if (!a || !a->n || !addr || split(addr, host, sizeof(host), port_text, sizeof(port_text)) < 0)
        return false;
    int port = parse_port(port_text);
    if (port < 1)
        return false;
    uint8_t ip[16];
    int family = parse_ip(host, ip);
    for (size_t i = 0; i < a->n; i++) {
        const allow_entry_t *e = &a->e[i];
        if (e->port != -1 && e->port != port)
            continue;
        if (e->family == -1 || (e->family == 0 && !family && strcasecmp(e->name, host) == 0) ||
            (e->family > 0 && e->family == family && same_prefix(e->net, ip, e->prefix)))
            return true;
    }
    return false;
}
