/*
 * cuda_plan.h - persistent plans of the CUDA backend (issue 15 item 3): collectives captured
 * into CUDA graphs, registered once at capture time and run once per replay of the graph
 * (cuda_plan.c; the protocol of the flags is in proto/wire.h, "Persistent plans").
 *
 * Lifetime: a plan is made when every rank's registration descriptor (COLLD_SQE_STREAM |
 * COLLD_SQE_PLAN) has been matched (cuda_plan_install, from cuda_progress, in sequence order with
 * the communicator's other collectives). It holds a reference on its communicator and, per rank, on
 * the session and on the registrations of the rank's buffers. A rank's part is freed when its
 * client says the graph is gone (COLLD_MSG_PLAN_FREE, the graph's user object destructor) or its
 * session ends; the plan is freed once no part is left and no run is in flight. Every function
 * runs with the daemon's lock held, except cuda_plan_session_msg (which takes it).
 */
#ifndef COLLD_SERVER_BACKENDS_CUDA_CUDA_PLAN_H
#define COLLD_SERVER_BACKENDS_CUDA_CUDA_PLAN_H

#include "server/backends/cuda/cuda.h"

/* gpu_session_t.plan_line[i] while a registration descriptor naming line i is admitted and not yet
 * installed (or failed). */
#define PLAN_LINE_PENDING ((struct gpu_plan_part *)1)

/* One rank's part of a plan. */
typedef struct gpu_plan_part {
    struct gpu_plan *plan;
    colld_session_t *session; /* holds a reference until the part is dropped (then NULL) */
    uint32_t line;            /* the session's plan line: the daemon's own copy, validated at admission */
    bool freed;               /* its graph is gone or its session ended: its line is never written again */
    bool taken;               /* its ready was taken for the run in flight */
    uint64_t arrival_ns;      /* when its ready was first seen for the next run (0: not yet) */
    colld_op_t op;            /* its registration descriptor: buffers (references held) and pointers */
} gpu_plan_part_t;

typedef struct gpu_plan {
    uint64_t id;
    colld_dcomm_t *comm; /* holds a reference */
    int nranks;
    int live;     /* parts not dropped */
    bool running; /* a run is on the launch or the running list */
    bool broken;  /* it cannot run any more: every replay is released without running */
    bool told;    /* a replay was released unrun and the communicator's ranks were told */
    colld_status_t error;
    char why[COLLD_DETAIL_LEN / 2];
    uint64_t runs, released;
    colld_coll_t *k;              /* the run, reused for every replay: ops[r] = &parts[r].op */
    struct gpu_plan *next, *prev; /* colld_gpus_t.plans */
    gpu_plan_part_t parts[];
} gpu_plan_t;

/* Admission of a registration descriptor (cuda_admit): its plan line must be one of the session's
 * and free; it is reserved (PLAN_LINE_PENDING) until the plan is installed or the descriptor fails. */
colld_status_t cuda_plan_admit(colld_backend_t *b, colld_op_t *op, colld_err_t *err);
/* A registration descriptor failed: its line's reservation goes. */
void cuda_plan_unreserve(colld_backend_t *b, colld_session_t *s, const colld_wire_sqe_t *sqe);
/* Whether a matched collective is a plan's registration, and the plan whose run k is (NULL: none). */
bool cuda_is_plan_reg(const colld_coll_t *k);
gpu_plan_t *cuda_plan_of_run(const colld_gpus_t *g, const colld_coll_t *k);
/* Make the plan of a matched registration (every rank's descriptor). COLLD_OK, or the error. */
colld_status_t cuda_plan_install(colld_backend_t *b, colld_coll_t *k, colld_err_t *err);
/* The plans' part of cuda_progress: start the runs every rank's graph has reached, time out those
 * some rank's graph never reaches, release the replays of broken plans, free the plans whose
 * parts are all gone. Returns the work done; brings *deadline forward. */
int cuda_plan_progress(colld_backend_t *b, uint64_t now, uint64_t *deadline);
/* Can cuda_plan_progress do something now (the watcher asks)? */
bool cuda_plan_movable(colld_backend_t *b);
/* A plan's run ended (its event fired, or its launch failed: k->status). */
void cuda_plan_run_finished(colld_backend_t *b, colld_coll_t *k);
/* Communicator c broke (or closed): its plans cannot run any more. */
void cuda_plan_comm_broken(colld_backend_t *b, colld_dcomm_t *c);
/* COLLD_MSG_PLAN_FREE (a hook's session_msg, given the daemon's CUDA backend b, NULL when it has
 * none; lock NOT held): -2 for another message type. */
int cuda_plan_session_msg(colld_backend_t *b, colld_session_t *s, const colld_wire_msg_t *m);
/* Free every plan (the backend stops; the engine and the watcher have stopped). */
void cuda_plans_free_all(colld_backend_t *b);

#endif /* COLLD_SERVER_BACKENDS_CUDA_CUDA_PLAN_H */
