/*
 * p2p_data.h - the messages the send/receive rank programs exchange and how they check them
 * (tests/integration/p2p_rank.c on host buffers, tests/gpu/gpu_p2p_rank.c on GPU buffers): each
 * message is a deterministic pattern of (from, to, step, k), and each buffer sits between guard
 * bytes that must survive the transfer.
 */
#ifndef COLLD_TESTS_P2P_DATA_H
#define COLLD_TESTS_P2P_DATA_H

#include <colld/colld.h>
#include <stdbool.h>
#include <stddef.h>

#define P2P_GUARD 64       /* guard bytes on each side of a buffer */
#define P2P_SENTINEL 0xA5  /* their value */

/* The `count` values of message k of a step from rank `from` to rank `to`, into out. */
void p2p_message(colld_dtype_t dt, int from, int to, unsigned step, int k, size_t count, void *out);

/* A buffer of `bytes` at byte `at` of a region, between P2P_GUARD sentinel bytes on each side (set
 * here). Returns where the buffer starts. */
unsigned char *p2p_slot(unsigned char *region, size_t at, size_t bytes);

/* Whether the guards around a p2p_slot buffer of `bytes` are intact. */
bool p2p_guards_intact(const unsigned char *buf, size_t bytes);

/* Whether buf holds message k of `step` from `from` to `to`: 1 yes, 0 no (*first_wrong: the first
 * byte that differs), -1 without memory. */
int p2p_message_matches(const void *buf, colld_dtype_t dt, int from, int to, unsigned step, int k, size_t count,
                        size_t *first_wrong);

#endif /* COLLD_TESTS_P2P_DATA_H */
