/*
 * host.h - the host backend: collectives run by a pool of worker threads directly on the ranks'
 * mapped buffers (host.c).
 */
#ifndef COLLD_SERVER_BACKENDS_HOST_HOST_H
#define COLLD_SERVER_BACKENDS_HOST_HOST_H

#include "server/core/backend.h"

/* The backend (registered in the registry, server/registry.c.in, last: it claims everything the others do not). */
extern const colld_backend_ops_t colld_host_backend;

#endif /* COLLD_SERVER_BACKENDS_HOST_HOST_H */
