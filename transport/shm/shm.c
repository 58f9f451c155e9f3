/*
 * shm.c - sealed shared memory (see shm.h).
 */
#include "transport/shm/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

int colld_shm_create(const char *name, size_t bytes, int *fd, void **ptr)
{
    int f = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    void *p = MAP_FAILED;
    if (f < 0 || ftruncate(f, (off_t)bytes) < 0 ||
        fcntl(f, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 ||
        (p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0)) == MAP_FAILED) {
        int e = errno;
        if (f >= 0)
            close(f);
        errno = e;
        return -1;
    }
    *fd = f;
    *ptr = p;
    return 0;
}
