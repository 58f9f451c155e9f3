/*
 * nccl_share_id.c - the NCCL test ranks' hand-over of the unique id (nccl_share_id.h).
 */
#include "nccl_share_id.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void nccl_test_share_id(ncclUniqueId *id, int rank, const char *id_file)
{
    char tmp[512];
    if (rank == 0) {
        ncclResult_t r = ncclGetUniqueId(id);
        if (r != ncclSuccess) {
            fprintf(stderr, "rank 0: ncclGetUniqueId: %s (%d): %s\n", ncclGetErrorString(r), (int)r,
                    ncclGetLastError(NULL));
            exit(1);
        }
        snprintf(tmp, sizeof(tmp), "%s.tmp", id_file);
        FILE *f = fopen(tmp, "wb");
        if (!f || fwrite(id, sizeof(*id), 1, f) != 1 || fclose(f) != 0 || rename(tmp, id_file) != 0) {
            perror(id_file);
            exit(1);
        }
        return;
    }
    for (int i = 0; i < 6000; i++) {
        FILE *f = fopen(id_file, "rb");
        if (f) {
            size_t got = fread(id, sizeof(*id), 1, f);
            fclose(f);
            if (got == 1)
                return;
        }
        nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
    }
    fprintf(stderr, "rank %d: no unique id in %s within 60 s\n", rank, id_file);
    exit(1);
}
