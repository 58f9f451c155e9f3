/*
 * recorder.h - every communicator's flight recorder (the last --trace-entries collectives: the
 * call, each rank's arrival, execution start and end, status) and straggler statistics, kept by a
 * module told of each communicator's life (backend.h). collctl trace and status read them.
 */
#ifndef COLLD_SERVER_OBSERVABILITY_RECORDER_H
#define COLLD_SERVER_OBSERVABILITY_RECORDER_H

#include "server/core/backend.h"

/* The module. */
extern const colld_comm_hooks_t colld_recorder_hooks;

/* The rank with the largest mean lateness, -1 when none lags by COLLD_STRAGGLER_MIN_NS (lock
 * held). */
int colld_recorder_slowest(const colld_dcomm_t *c);
#define COLLD_STRAGGLER_MIN_NS 100000ull /* 100 us */

#endif /* COLLD_SERVER_OBSERVABILITY_RECORDER_H */
