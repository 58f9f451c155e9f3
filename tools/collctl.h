/*
 * collctl.h - what collctl.c shares with the files of its other commands (collctl_doctor.c).
 */
#ifndef COLLD_TOOLS_COLLCTL_H
#define COLLD_TOOLS_COLLCTL_H

#include "client/client_internal.h"

#include <stdint.h>

/* The version of collctl's --json objects (the "schema_version" field of each): it goes up
 * whenever a field changes meaning or disappears, not when one is added. */
#define COLLCTL_JSON_SCHEMA_VERSION 1

/* One unary call of the admin session; prints the failure. Returns 0 or 1. */
int collctl_call(colld_client_t *c, const char *what, const char *method, ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *desc, ProtobufCMessage **resp);
/* Sanitize every string of a message from the daemon before it is printed. */
void collctl_clean_message(ProtobufCMessage *m);
/* Print a JSON string literal. */
void collctl_json_str(const char *s);

/* collctl doctor (collctl_doctor.c): returns the exit status (0 nothing wrong, 1 a problem). */
int collctl_doctor(colld_client_t *c, int json, int64_t since_s, int64_t stuck_ms, int64_t straggler_ms);

#endif
