/*
 * shm.h - shared memory the daemon makes and hands to its tenants: a memfd sealed against
 * shrinking and growing (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), mapped read-write. A tenant
 * that maps it cannot truncate it under the daemon's mapping (which would be a SIGBUS in the
 * daemon). Used for the session rings (ring.h), the fast areas and the GPU flag areas.
 */
#ifndef COLLD_TRANSPORT_SHM_H
#define COLLD_TRANSPORT_SHM_H

#include <stddef.h>

/* Create such an area of `bytes` (a multiple of the page size) named `name` (for /proc). Returns
 * 0 with *fd and *ptr, or -1 with errno set and nothing left open. */
int colld_shm_create(const char *name, size_t bytes, int *fd, void **ptr);

#endif /* COLLD_TRANSPORT_SHM_H */
