/*
 * health.h - GPU health as the daemon shows it (issue 30 item 2): one record per GPU a device
 * backend drives, filled by that backend's health pass (server/backends/cuda/cuda_health.c, from
 * NVML) and read by the status RPC (collctl status, collctl doctor), the metrics and the events.
 * The core knows no backend: the backend publishes copies of these records into the daemon
 * (colld_daemon_t.gpu_health, under the daemon's lock), the readers copy them out.
 *
 * A counter that NVML does not support on a GPU (or that an older NVML lacks) is -1: "not
 * supported" where it is shown, never an error.
 */
#ifndef COLLD_SERVER_CORE_HEALTH_H
#define COLLD_SERVER_CORE_HEALTH_H

#include <stdbool.h>
#include <stdint.h>

#define COLLD_GPU_HEALTH_MAX 64 /* GPUs shown; a node has at most 16 today */

typedef struct colld_gpu_health {
    int index;         /* the daemon's GPU index (CUDA's ordinal as the daemon sees it) */
    char name[96];     /* "NVIDIA H200" */
    char uuid[48];     /* "GPU-..." as NVML writes it */
    bool nvml;         /* matched to an NVML device and read */
    char status[128];  /* "ok", or why it was not read ("not found by NVML", "GPU is lost") */
    int64_t ecc_uncorrected;     /* volatile uncorrected ECC errors (since the driver loaded) */
    int64_t ecc_uncorrected_new; /* of them, seen since the daemon started */
    int64_t retired_pending;     /* 1: pages retired, pending a reset */
    int64_t remap_pending;       /* 1: row remap pending a reset */
    int64_t remap_failure;       /* 1: a row remap failed (fatal) */
    int64_t pcie_replay;         /* PCIe replay counter */
    int64_t nvlink_errors;       /* CRC (flit + data), replay and recovery counts over its active links */
    uint64_t xid_count;          /* critical Xid events seen since the daemon started */
    uint32_t last_xid;
    int64_t last_xid_ms;         /* wall clock */
    int64_t throttle;            /* clock event reasons (thermal, power) mask */
    bool thermal, power;         /* throttled now, by temperature, by power */
    int64_t since_ms;            /* wall clock of the first change for the worse, 0: none */
    bool drained;                /* a fatal event: no new work on it */
    char drain_why[192];
    int64_t drained_ms;
    char users[192];             /* "communicator 7 ranks 0-3", "" for none */
    uint64_t passes;             /* health passes over it */
    uint64_t pass_ns;            /* the last pass's cost on it */
} colld_gpu_health_t;

#endif /* COLLD_SERVER_CORE_HEALTH_H */
