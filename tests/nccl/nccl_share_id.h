/*
 * nccl_share_id.h - the NCCL test ranks' hand-over of the unique id (nccl_rank.c, nccl_gpu_rank.c),
 * as an NCCL program's own bootstrap would do it: through a file.
 */
#ifndef COLLD_TESTS_NCCL_SHARE_ID_H
#define COLLD_TESTS_NCCL_SHARE_ID_H

#include "nccl.h"

/* Rank 0: a new unique id (ncclGetUniqueId) into id_file, whole (written aside, then renamed); the
 * others: wait for it, 60 s at most. Exits the process (status 1, the reason on stderr) on failure. */
void nccl_test_share_id(ncclUniqueId *id, int rank, const char *id_file);

#endif
