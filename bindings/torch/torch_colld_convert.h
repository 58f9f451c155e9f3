/*
 * torch_colld_convert.h - what torch_colld checks and converts on the caller's thread before an
 * operation is queued (a bad call raises there at once): colld's dtype and reduction for a
 * tensor and a c10d ReduceOp (PREMUL_SUM included), the tensors colld can take, and the text of
 * a failed colld call. Internal to torch_colld.
 */
#ifndef COLLD_TORCH_COLLD_CONVERT_H
#define COLLD_TORCH_COLLD_CONVERT_H

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <colld/colld.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torch_colld
{

/* The colld type of a tensor's dtype for a reduction; raises for the types colld has not. */
colld_dtype_t reduce_dtype(const char *op, const at::Tensor &t);

/* A collective's reduction as colld takes it: a built-in op, or a premultiplied sum with this
 * rank's scalar word (the factor in the collective's dtype; made into an operator of the
 * communicator when the collective is issued, with_op). */
struct RedOp {
    colld_redop_t op = COLLD_SUM;
    bool premul = false;
    uint64_t word = 0;
};

/* The colld reduction of a c10d ReduceOp for a tensor of `dtype`; raises for the bitwise ones. */
RedOp reduce_op(const char *op, const c10d::ReduceOp &r, at::ScalarType dtype);

/* Issue one colld call with the collective's op on the worker thread (which owns the
 * communicator): a premultiplied sum gets an operator of c made for the call and destroyed right
 * after it (the call has taken the scalar). */
template <typename F> colld_status_t with_op(colld_comm_t *c, const RedOp &r, colld_dtype_t dt, F call)
{
    if (!r.premul)
        return call(r.op);
    colld_redop_t op;
    colld_status_t st = colld_redop_create_premul_sum(c, &r.word, dt, &op);
    if (st != COLLD_OK)
        return st;
    st = call(op);
    colld_status_t d = colld_redop_destroy(c, op);
    return st != COLLD_OK ? st : d;
}

/* A tensor colld can take: dense, on the CPU (or, built with COLLD_TORCH_CUDA, a CUDA device; an
 * operation's tensors must all be on one device, which post() checks). */
void check_cpu(const char *op, const at::Tensor &t);

/* The one tensor of an operation that takes a list with one tensor per device. */
const at::Tensor &single(const char *op, const std::vector<at::Tensor> &tensors);

/* A contiguous tensor holding t's values: t itself, or a copy. */
at::Tensor dense(const at::Tensor &t);

/* The buffer's size in bytes, for operations that move bytes (broadcast, all-gather): any dtype
 * travels as uint8. */
size_t nbytes(const at::Tensor &t);

/* A message for a failed colld call: the status name, then colld's detail (it names the rank
 * that died, the call that mismatched, ...), or what the status means when there is none. */
std::string colld_failure(const char *what, colld_status_t st, const char *detail);
} // namespace torch_colld

#endif
