/*
 * collctl.h - what collctl.c shares with the files of its other commands (collctl_doctor.c).
 */
#ifndef COLLD_TOOLS_COLLCTL_H
#define COLLD_TOOLS_COLLCTL_H

#include "client/client_internal.h"
#include "colld.pb-c.h"
#include "common/linkhealth.h"

#include <stdbool.h>

#include <stdint.h>

/* The version of collctl's --json objects (the "schema_version" field of each): it goes up
 * whenever a field changes meaning or disappears, not when one is added. */
#define COLLCTL_JSON_SCHEMA_VERSION 1

/* A directed link of this node: to a peer (tx) or from it, its measured rate and the verdict of
 * the slow-link rule (common/linkhealth.h) among all of this node's links. */
typedef struct {
    size_t peer;           /* index in the StatusResponse's peers */
    bool tx;               /* this node -> the peer */
    const char *from, *to; /* node names (pointers into the response) */
    colld_link_rate_t l;
} collctl_link_t;
#define COLLCTL_MAX_LINKS 128 /* two per peer; a status lists at most 64 peers */

/* This node's links from a status answer, two per peer (to it, from it; a peer not up has no
 * rate), with the rule applied. Returns how many. */
size_t collctl_links(const Colld__V1__StatusResponse *r, collctl_link_t *out, size_t max);
/* The slow ones among links[n] as a JSON array. */
void collctl_links_json(const collctl_link_t *links, size_t n);

/* One unary call of the admin session; prints the failure. Returns 0 or 1. */
int collctl_call(colld_client_t *c, const char *what, const char *method, ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *desc, ProtobufCMessage **resp);
/* Sanitize every string of a message from the daemon before it is printed. */
void collctl_clean_message(ProtobufCMessage *m);
/* Print a JSON string literal. */
void collctl_json_str(const char *s);

/* collctl doctor (collctl_doctor.c): returns the exit status (0 nothing wrong, 1 a problem). */
/* GPU health (collctl_gpu.c): the status section, its JSON fields (",\"gpus\":[...]"), and the
 * doctor's findings of one GPU (how many, at most max). */
void collctl_gpu_text(const Colld__V1__StatusResponse *r);
void collctl_gpu_json(const Colld__V1__StatusResponse *r);
typedef struct {
    bool problem;
    char what[24];
    char text[640];
} collctl_gpu_finding_t;
/* node: the node the GPU is on, named in each finding's text ("GPU 3 (...) on node 31"); NULL or
 * "" for none. */
int collctl_gpu_findings(const Colld__V1__GpuHealth *g, const char *node, collctl_gpu_finding_t *out, int max);

typedef struct {
    int json;
    int64_t since_s, stuck_ms, straggler_ms;
    bool local;              /* --local: this node only, no other node's report */
    int64_t node_timeout_ms; /* --node-timeout-ms: how long the other nodes' reports are waited for */
} collctl_doctor_opts_t;
int collctl_doctor(colld_client_t *c, const collctl_doctor_opts_t *o);

/* collctl probe (collctl_probe.c): bytes 0 for the daemon's default; returns the exit status (0 every
 * link measured and none slow, 1 otherwise). */
int collctl_probe(colld_client_t *c, int json, uint64_t bytes);

#endif
