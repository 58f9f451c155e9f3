/*
 * colld_perf_names.c - colld-perf's names of the collectives, datatypes and reduction operations
 * (nccl-tests' names, and colld's own datatype names as aliases): the options parse them, the
 * table, the JSON and the messages print them. The collectives' order is colld_perf.h's K_* enum;
 * the datatypes' and the operations' are colld_dtype_t's and colld_redop_t's.
 */
#include "colld_perf.h"

const char *const perf_kind_names[K_COUNT] = { "allreduce", "broadcast", "reduce", "allgather", "reducescatter" };
/* nccl-tests' type names, in colld_dtype_t order. */
const char *const perf_dtype_names[COLLD_DTYPE_COUNT] = { "int8",  "uint8", "int32",    "uint32", "int64",
                                                          "uint64", "half", "bfloat16", "float",  "double" };
/* Accepted as well: colld's own names. */
const char *const perf_dtype_aliases[COLLD_DTYPE_COUNT] = { "i8",      "u8",       "i32",      "u32",     "i64",
                                                            "u64",     "float16",  "bf16",     "float32", "float64" };
const char *const perf_op_names[COLLD_REDOP_COUNT] = { "sum", "prod", "min", "max", "avg" };
