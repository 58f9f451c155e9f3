/*
 * collctl.c - the operators' command-line tool for a running colld.
 *
 *   collctl [--socket PATH] [--json] status
 *
 * status lists the daemon's sessions (pid, uid, process, attached since, communicators, shared
 * memory) and communicators (id, name, size, ranks joined, state, operations completed/failed,
 * last error). --json prints the same as one JSON object.
 */
#include "client/client_internal.h"
#include "colld.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char USAGE[] =
    "usage: collctl [--socket PATH] [--json] COMMAND\n"
    "\n"
    "Commands:\n"
    "  status    sessions and communicators of the daemon\n"
    "\n"
    "Options:\n"
    "  --socket PATH  the daemon's socket (env COLLD_SOCKET; default /run/colld/colld.sock for root,\n"
    "                 $XDG_RUNTIME_DIR/colld.sock otherwise)\n"
    "  --json         machine-readable output\n"
    "  -h, --help     this text\n";

/* Print a JSON string literal. */
static void json_str(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

static void print_json(const Colld__V1__StatusResponse *r)
{
    printf("{\"daemon_version\":");
    json_str(r->daemon_version);
    printf(",\"daemon_pid\":%d,\"started_unix_ms\":%lld,\"socket\":", r->pid, (long long)r->started_unix_ms);
    json_str(r->socket);
    printf(",\"sessions\":[");
    for (size_t i = 0; i < r->n_sessions; i++) {
        const Colld__V1__SessionInfo *s = r->sessions[i];
        printf("%s{\"id\":%llu,\"pid\":%d,\"uid\":%u,\"gid\":%u,\"attached_unix_ms\":%lld,\"process\":", i ? "," : "",
               (unsigned long long)s->id, s->pid, s->uid, s->gid, (long long)s->attached_unix_ms);
        json_str(s->process_name);
        printf(",\"comms\":%u,\"registered_bytes\":%llu,\"admin\":%s}", s->comms,
               (unsigned long long)s->registered_bytes, s->admin ? "true" : "false");
    }
    printf("],\"comms\":[");
    for (size_t i = 0; i < r->n_comms; i++) {
        const Colld__V1__CommInfo *c = r->comms[i];
        printf("%s{\"id\":%llu,\"name\":", i ? "," : "", (unsigned long long)c->id);
        json_str(c->name);
        printf(",\"nranks\":%d,\"joined\":%d,\"state\":", c->nranks, c->joined);
        json_str(c->state);
        printf(",\"ops_completed\":%llu,\"ops_failed\":%llu,\"uid\":%u,\"timeout_ms\":%d,\"last_error\":",
               (unsigned long long)c->ops_completed, (unsigned long long)c->ops_failed, c->uid, c->timeout_ms);
        json_str(c->last_error);
        printf(",\"members\":[");
        for (size_t m = 0; m < c->n_members; m++)
            printf("%s{\"rank\":%d,\"session\":%llu,\"pid\":%d}", m ? "," : "", c->members[m]->rank,
                   (unsigned long long)c->members[m]->session_id, c->members[m]->pid);
        printf("]}");
    }
    printf("]}\n");
}

/* "2026-11-21 08:02:57" in local time. */
static void fmt_time(int64_t unix_ms, char *buf, size_t len)
{
    time_t t = (time_t)(unix_ms / 1000);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm);
}

static void fmt_bytes(uint64_t b, char *buf, size_t len)
{
    const char *unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
}

static void print_text(const Colld__V1__StatusResponse *r)
{
    char when[32], size[32];
    fmt_time(r->started_unix_ms, when, sizeof(when));
    printf("colld %s, pid %d, started %s, socket %s\n\n", r->daemon_version, r->pid, when, r->socket);
    printf("SESSIONS (%zu)\n", r->n_sessions);
    printf("  %-6s %-8s %-6s %-20s %-19s %5s %10s\n", "ID", "PID", "UID", "PROCESS", "ATTACHED", "COMMS", "SHARED");
    for (size_t i = 0; i < r->n_sessions; i++) {
        const Colld__V1__SessionInfo *s = r->sessions[i];
        char name[64];
        snprintf(name, sizeof(name), "%s%s", s->process_name, s->admin ? " [admin]" : "");
        fmt_time(s->attached_unix_ms, when, sizeof(when));
        fmt_bytes(s->registered_bytes, size, sizeof(size));
        printf("  %-6llu %-8d %-6u %-20s %-19s %5u %10s\n", (unsigned long long)s->id, s->pid, s->uid, name, when,
               s->comms, size);
    }
    printf("\nCOMMUNICATORS (%zu)\n", r->n_comms);
    printf("  %-6s %-16s %5s %6s %-8s %12s %10s %10s\n", "ID", "NAME", "RANKS", "JOINED", "STATE", "OPS-DONE",
           "OPS-FAILED", "TIMEOUT");
    for (size_t i = 0; i < r->n_comms; i++) {
        const Colld__V1__CommInfo *c = r->comms[i];
        char to[32];
        snprintf(to, sizeof(to), "%d ms", c->timeout_ms);
        printf("  %-6llu %-16s %5d %6d %-8s %12llu %10llu %10s\n", (unsigned long long)c->id, c->name, c->nranks,
               c->joined, c->state, (unsigned long long)c->ops_completed, (unsigned long long)c->ops_failed, to);
        printf("         ranks:");
        for (size_t m = 0; m < c->n_members; m++)
            printf(" %d=pid %d", c->members[m]->rank, c->members[m]->pid);
        printf("\n");
        if (c->last_error && *c->last_error)
            printf("         last error: %s\n", c->last_error);
    }
}

int main(int argc, char **argv)
{
    const char *socket = NULL, *cmd = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc)
            socket = argv[++i];
        else if (strncmp(argv[i], "--socket=", 9) == 0)
            socket = argv[i] + 9;
        else if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(USAGE, stdout);
            return 0;
        } else if (argv[i][0] == '-' || cmd) {
            fprintf(stderr, "collctl: unexpected argument '%s'\n%s", argv[i], USAGE);
            return 2;
        } else
            cmd = argv[i];
    }
    if (!cmd || strcmp(cmd, "status") != 0) {
        fprintf(stderr, cmd ? "collctl: unknown command '%s'\n%s" : "collctl: no command given%s\n%s",
                cmd ? cmd : "", USAGE);
        return 2;
    }
    colld_client_t *c;
    colld_status_t st = colld__connect_role(socket, COLLD_ROLE_ADMIN, &c);
    if (st != COLLD_OK) {
        fprintf(stderr, "collctl: cannot reach colld: %s: %s\n", colld_status_name(st), colld_status_string(st));
        return 1;
    }
    Colld__V1__StatusRequest req = COLLD__V1__STATUS_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(c, &ref);
    req.session = &ref;
    Colld__V1__StatusResponse *resp = NULL;
    char detail[256] = "";
    st = colld__client_rpc(c, "/colld.v1.Colld/Status", &req.base, &colld__v1__status_response__descriptor,
                           COLLD_CLIENT_RPC_TIMEOUT_MS, (ProtobufCMessage **)&resp, detail, sizeof(detail));
    if (st != COLLD_OK) {
        fprintf(stderr, "collctl: status failed: %s: %s\n", colld_status_name(st), detail);
        colld_disconnect(c);
        return 1;
    }
    if (json)
        print_json(resp);
    else
        print_text(resp);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    colld_disconnect(c);
    return 0;
}
