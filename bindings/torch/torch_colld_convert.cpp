/*
 * torch_colld_convert.cpp - torch_colld's checks and conversions (torch_colld_convert.h says what
 * each does).
 */
#include "torch_colld_convert.h"

#include <cstring>

namespace torch_colld
{

colld_dtype_t reduce_dtype(const char *op, const at::Tensor &t)
{
    switch (t.scalar_type()) {
    case at::kChar:
        return COLLD_INT8;
    case at::kByte:
        return COLLD_UINT8;
    case at::kInt:
        return COLLD_INT32;
    case at::kUInt32:
        return COLLD_UINT32;
    case at::kLong:
        return COLLD_INT64;
    case at::kUInt64:
        return COLLD_UINT64;
    case at::kHalf:
        return COLLD_FLOAT16;
    case at::kBFloat16:
        return COLLD_BFLOAT16;
    case at::kFloat:
        return COLLD_FLOAT32;
    case at::kDouble:
        return COLLD_FLOAT64;
    default:
        break;
    }
    TORCH_CHECK(
        false, "torch_colld: ", op, ": dtype ", t.scalar_type(),
        " is not supported by colld (int8, uint8, int32, uint32, int64, uint64, float16, bfloat16, float32, float64 are)");
}

/* The premultiplied sum of a PREMUL_SUM ReduceOp (torch.distributed._make_nccl_premul_sum): its
 * factor, a float or a one-element CPU tensor, converted to `dtype` now, as ProcessGroupNCCL
 * converts it (T(factor)); a tensor factor is read now, when the collective is called. */
static RedOp premul_op(const char *op, const c10d::ReduceOp &r, at::ScalarType dtype)
{
    /* torch makes PREMUL_SUM only with this supplement (makeNCCLPreMulSum), as ProcessGroupNCCL
     * relies on; torch itself refuses a tensor factor of more than one element. */
    const auto *sup = static_cast<const c10d::NCCLPreMulSumSupplement *>(r.supplement_.get());
    TORCH_CHECK(sup, "torch_colld: ", op,
                ": a PREMUL_SUM op without its factor (make it with torch.distributed._make_nccl_premul_sum)");
    at::Tensor f;
    if (!sup->tensor_factor.defined()) {
        f = at::scalar_tensor(sup->double_factor, at::TensorOptions().dtype(at::kDouble));
    } else {
        TORCH_CHECK(sup->tensor_factor.numel() == 1, "torch_colld: ", op,
                    ": a PREMUL_SUM factor must be a tensor of one element");
        f = sup->tensor_factor;
    }
    f = f.to(at::kCPU)
            .to(dtype)
            .contiguous(); /* a factor on the GPU is read now (the stream's work before it is done) */
    RedOp o;
    o.premul = true;
    std::memcpy(&o.word, f.data_ptr(), f.element_size()); /* the scalar word: the value's bytes first */
    return o;
}

RedOp reduce_op(const char *op, const c10d::ReduceOp &r, at::ScalarType dtype)
{
    RedOp o;
    switch (r.op_) {
    case c10d::ReduceOp::SUM:
        o.op = COLLD_SUM;
        return o;
    case c10d::ReduceOp::PRODUCT:
        o.op = COLLD_PROD;
        return o;
    case c10d::ReduceOp::MIN:
        o.op = COLLD_MIN;
        return o;
    case c10d::ReduceOp::MAX:
        o.op = COLLD_MAX;
        return o;
    case c10d::ReduceOp::AVG:
        o.op = COLLD_AVG;
        return o;
    case c10d::ReduceOp::PREMUL_SUM:
        return premul_op(op, r, dtype);
    default:
        break;
    }
    TORCH_CHECK(false, "torch_colld: ", op, ": reduce op ", static_cast<int>(r.op_),
                " is not supported by colld (SUM, PRODUCT, MIN, MAX, AVG and PREMUL_SUM are; BAND, BOR and BXOR are "
                "not)");
}

void check_cpu(const char *op, const at::Tensor &t)
{
#ifndef COLLD_TORCH_CUDA
    TORCH_CHECK(!t.is_cuda(), "torch_colld: ", op,
                ": CUDA tensors are not supported yet (torch_colld runs CPU tensors only; see docs/torch.md)");
#endif
    TORCH_CHECK(t.device().is_cpu() || t.is_cuda(), "torch_colld: ", op, ": the tensor is on ", t.device(),
                ", only CPU and CUDA tensors are supported");
    TORCH_CHECK(t.layout() == at::kStrided, "torch_colld: ", op, ": only dense (strided) tensors are supported, not ",
                t.layout());
}

const at::Tensor &single(const char *op, const std::vector<at::Tensor> &tensors)
{
    TORCH_CHECK(tensors.size() == 1, "torch_colld: ", op, ": expects exactly one tensor (one per process), got ",
                tensors.size());
    check_cpu(op, tensors[0]);
    return tensors[0];
}

at::Tensor dense(const at::Tensor &t)
{
    return t.is_contiguous() ? t : t.contiguous();
}

size_t nbytes(const at::Tensor &t)
{
    return static_cast<size_t>(t.numel()) * t.element_size();
}

std::string colld_failure(const char *what, colld_status_t st, const char *detail)
{
    std::string m = std::string("torch_colld: ") + what + " failed: ";
    std::string name = colld_status_name(st);
    if (!detail || !*detail)
        return m + name + ": " + colld_status_string(st);
    if (std::string(detail).rfind(name, 0) == 0) /* the detail starts with the status name already */
        return m + detail;
    return m + name + ": " + detail;
}
} // namespace torch_colld
