/*
 * torch_colld.cpp - a torch.distributed (c10d) backend over libcolld, for torch 2.x.
 *
 * `import torch_colld` (torch_colld/__init__.py) registers the backend "colld" for CPU tensors with
 * this module's ProcessGroupColld, a c10d::Backend, as its creator, so
 * `dist.init_process_group("colld", ...)` (or "cpu:colld") reaches the local colld daemon
 * ($COLLD_SOCKET, else colld's default socket) through libcolld. torch wraps the backend in its
 * own c10d::ProcessGroup, which dispatches each CPU tensor's operation here.
 *
 * One process group is one colld client and one colld communicator. Its unique id travels through
 * the c10d store given to the creator (a PrefixStore per group, so subgroups get ids of their own).
 * A colld_comm_t is used by one thread at a time, so the colld calls of a group run on the
 * group's own worker thread: an operation is checked and staged on the caller's thread, queued,
 * issued by the worker, completed there with colld_comm_synchronize, and its Work (and the Work's
 * future, which DDP waits on) is marked done there. Operations of one group run in the order they
 * were called, as c10d requires; the caller never blocks on the daemon. The exception: a small
 * host operation posted while the worker is idle is issued by the caller's thread, which looks
 * briefly for its completion and otherwise hands it, issued, to the worker (run_inline).
 *
 * DDP's gradient buckets are allocated in colld memory (supportsTensorAlloc / allocateTensor, over
 * torch_colld_alloc.h's allocator), so DDP's all-reduces are zero copy.
 *
 * Buffers: CPU tensors. A contiguous tensor's own memory goes to libcolld (it stages host memory
 * that is not colld's, see colld.h); a non-contiguous one is copied into a contiguous tensor and
 * the result copied back. List outputs and inputs (all_gather, reduce_scatter, gather, scatter,
 * all_to_all) are staged in one contiguous tensor. Operations that only move bytes (broadcast,
 * the gathers, scatter, all-to-all, send and receive) take every dtype, as uint8. Receives from
 * any source are refused with a RuntimeError saying so (docs/torch.md). CUDA tensors too, unless
 * built with -DCOLLD_TORCH_CUDA=ON: then they are stream-ordered on the caller's current stream
 * (Op in torch_colld_work.h; run on an H200 with 2 processes: docs/gpu-testing.md).
 *
 * Files: this one is the backend; torch_colld_work.h its Work and queued operation,
 * torch_colld_alloc.{h,cpp} the CPU allocator of colld memory,
 * torch_colld_convert.{h,cpp} the checks and conversions made on the caller's thread,
 * torch_colld_cuda.{h,cpp} the CUDA stream and event calls (CUDA build only).
 *
 * Point-to-point: send and recv are colld_send / colld_recv, matched by colld in posting order per
 * pair of ranks (the k-th send a->b meets the k-th receive b<-a); colld has no tags, so a non-zero
 * tag travels in front of the tensor and the receiver checks it (see send()). A rank's operations
 * run one after the other, so ranks that exchange must use batch_isend_irecv: the backend says it
 * supports coalescing, so torch runs a batch between startCoalescing and endCoalescing, and the
 * operations posted in between run as one colld group, concurrently (a ring exchange cannot
 * deadlock); endCoalescing returns the one Work of the whole batch.
 */
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/chrono.h>

#include <colld/colld.h>

#include "torch_colld_alloc.h"
#include "torch_colld_convert.h"
#include "torch_colld_work.h"

#include <ATen/EmptyTensor.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace torch_colld
{
namespace
{

const char *const kUidKey = "torch_colld/uid";

/* Added to a COLLD_ERR_MISMATCH of a send or receive, and of an all-to-all: how
 * torch_colld's calls look to colld, whose detail names them. */
const char *const kP2PHint = "torch_colld sends a tensor as its bytes (uint8), after its tag as 1 x int64 when "
                             "the tag is not 0: the two ranks' tensor sizes or tags differ";
const char *const kAlltoallvHint = "torch_colld runs all_to_all as colld_alltoallv, sends and receives of bytes: "
                                   "the ranks' split sizes or tensor sizes disagree";

class ProcessGroupColld;
/* Every live process group, for shutdown_all (at interpreter exit). */
std::mutex g_live_mu;
std::set<ProcessGroupColld *> g_live; /* guarded by g_live_mu */

/* ----------------------------------------------------------------------------------------------
 * The process group
 * -------------------------------------------------------------------------------------------- */

class ProcessGroupColld : public c10d::Backend
{
  public:
    /* Connect to the daemon and join the group's communicator: rank 0 makes the unique id and
     * publishes it in the store, the others read it (the store's get waits for it). Blocks until
     * every rank has joined or `timeout` expires. Raises with colld's detail on failure. */
    ProcessGroupColld(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                      std::chrono::milliseconds timeout)
        : c10d::Backend(rank, size), timeout_(timeout)
    {
        colld_client_t *client = nullptr;
        colld_status_t st = colld_connect(nullptr, &client);
        if (st != COLLD_OK)
            throw std::runtime_error(colld_failure("colld_connect", st, colld_last_error(nullptr)));
        /* Tensors from empty() hold the client too: it disconnects when the group and they are gone. */
        client_ = std::shared_ptr<colld_client_t>(client, [](colld_client_t *c) { colld_disconnect(c); });
        colld_unique_id_t uid{};
        try {
            if (rank == 0) {
                st = colld_get_unique_id(client, &uid);
                if (st != COLLD_OK)
                    throw std::runtime_error(colld_failure("colld_get_unique_id", st, colld_last_error(client)));
                const uint8_t *p = reinterpret_cast<const uint8_t *>(&uid);
                store->set(kUidKey, std::vector<uint8_t>(p, p + sizeof(uid)));
            } else {
                std::vector<uint8_t> v = store->get(kUidKey);
                if (v.size() != sizeof(uid))
                    throw std::runtime_error("torch_colld: the store's " + std::string(kUidKey) + " holds " +
                                             std::to_string(v.size()) + " bytes, not a colld unique id (" +
                                             std::to_string(sizeof(uid)) + ")");
                std::memcpy(&uid, v.data(), sizeof(uid));
            }
            colld_comm_config_t cfg = comm_config(timeout);
            st = colld_comm_init_rank(client, &comm_, size, uid, rank, &cfg);
            if (st != COLLD_OK)
                throw std::runtime_error(colld_failure("colld_comm_init_rank", st, colld_last_error(client)));
        } catch (...) {
            client_.reset();
            throw;
        }
        start();
    }

    /* A group split from another (split()): it takes over `comm`, a communicator of the parent's
     * colld client, which it shares with the parent (each group destroys its own communicator;
     * the client disconnects when the last of them, and the tensors from empty(), are gone). */
    ProcessGroupColld(std::shared_ptr<colld_client_t> client, colld_comm_t *comm, int rank, int size,
                      std::chrono::milliseconds timeout)
        : c10d::Backend(rank, size), client_(std::move(client)), comm_(comm), timeout_(timeout)
    {
        start();
    }

    /* Stop the worker (operations still queued fail), then leave the communicator and the
     * daemon, unless shutdown() or abort() did already. */
    ~ProcessGroupColld() override
    {
        {
            std::lock_guard<std::mutex> lock(g_live_mu);
            g_live.erase(this);
        }
        release(false);
        client_.reset(); /* disconnects, unless tensors from empty() are still alive */
    }

    /* destroy_process_group: the operation the worker runs completes, what is still queued
     * fails, and the communicator is destroyed (the peers see this rank leave). Later operations
     * fail at once. */
    void shutdown() override
    {
        release(false);
    }

    /* _abort_process_group: as shutdown, but the operation the worker runs is aborted
     * (colld_comm_abort: it and the peers' fail with COLLD_ERR_ABORTED) instead of waited for. */
    void abort() override
    {
        release(true);
    }

    /* Stop the worker: what is still queued fails; the operation it runs completes first, or,
     * with `abort`, is aborted (colld_comm_abort: it and the peers' fail with COLLD_ERR_ABORTED)
     * so that a process leaving with an operation its peers never join does not wait for the
     * group's timeout. The GIL is released meanwhile: the worker may be running a future's
     * callbacks that take it. */
    void stop(bool abort = false)
    {
        if (Py_IsInitialized() && PyGILState_Check()) {
            pybind11::gil_scoped_release nogil;
            stop_worker(abort);
        } else {
            stop_worker(abort);
        }
    }

    /* Stop the workers of every live group, aborting what they run (torch_colld registers it with
     * atexit). Python kills a thread that takes the GIL once finalization has begun, and a worker
     * completing a future may take it (to release a Python callback): that would end the process
     * with std::terminate. */
    static void stop_all()
    {
        std::lock_guard<std::mutex> lock(g_live_mu);
        for (ProcessGroupColld *pg : g_live)
            pg->stop(true);
    }

    const std::string getBackendName() const override
    {
        return "colld";
    }

    /* Sequence numbers, which torch's ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL) compares
     * between the ranks before each collective: the number of collectives this rank has posted
     * on the group (sends and receives not counted: they differ between ranks), from 0 on every
     * rank, as ProcessGroupNCCL counts them; the group is made by every rank at once, so there is
     * nothing to agree on. */
    void setSequenceNumberForGroup() override
    {
    }

    uint64_t getSequenceNumberForGroup() override
    {
        return seq_.load(std::memory_order_relaxed);
    }

    /* A CPU tensor in memory shared with this group's daemon (colld_mem_alloc(COLLD_MEM_HOST)):
     * the group's operations on it are zero copy, where any other tensor is staged by libcolld.
     * The memory is freed when the tensor's storage is; the colld client lives until then (past
     * the group's destruction if need be). Its contents are uninitialized, as torch.empty's. */
    at::Tensor empty(const std::vector<int64_t> &sizes, at::ScalarType dtype)
    {
        at::TensorOptions options = at::TensorOptions().dtype(dtype).device(at::kCPU);
        int64_t numel = 1;
        for (int64_t d : sizes) {
            TORCH_CHECK(d >= 0, "torch_colld.empty: negative dimension ", d);
            TORCH_CHECK(d == 0 || numel <= INT64_MAX / d, "torch_colld.empty: the size overflows");
            numel *= d;
        }
        size_t elem = c10::elementSize(dtype);
        TORCH_CHECK(numel == 0 || static_cast<uint64_t>(numel) <= SIZE_MAX / elem,
                    "torch_colld.empty: the size overflows");
        if (numel == 0)
            return at::empty(sizes, options);
        void *p = nullptr;
        std::shared_ptr<colld_client_t> client = client_;
        colld_status_t st = colld_mem_alloc(client.get(), &p, static_cast<size_t>(numel) * elem, COLLD_MEM_HOST);
        if (st != COLLD_OK)
            throw std::runtime_error(colld_failure("empty (colld_mem_alloc)", st, colld_last_error(client.get())));
        return at::from_blob(
            p, sizes, [client](void *q) { colld_mem_free(client.get(), q); }, options);
    }

    /* ---- colld memory for torch's own allocations ---- */

    /* torch's DDP reducer asks the group's default backend for each gradient bucket
     * (Reducer::initialize_buckets, when DDP_DISABLE_COMM_MEM is "0", which torch_colld sets
     * where the user has not: torch_colld/__init__.py): CPU buckets are then allocated in colld
     * memory and DDP's all-reduces of them are zero copy. Off with TORCH_COLLD_DDP_BUCKETS=0. A
     * CUDA device (the CUDA build serves both) gets torch's own allocation. */
    bool supportsTensorAlloc(c10::DeviceIndex idx) override
    {
#ifdef COLLD_TORCH_CUDA
        if (idx >= 0)
            return false; /* a CUDA device's index; the CPU's is -1 */
#else
        (void)idx;
#endif
        return ddp_buckets_;
    }

    /* A flat tensor of `size` elements of options' dtype in colld memory (torch's allocator's
     * memory where colld memory cannot be had: ColldAllocator). */
    at::Tensor allocateTensor(long size, at::TensorOptions options) override
    {
        if (options.has_device() && !options.device().is_cpu())
            return at::empty({ size }, options);
        return at::detail::empty_generic({ size }, allocator_, c10::DispatchKeySet(c10::DispatchKey::CPU),
                                         c10::typeMetaToScalarType(options.dtype()), options.memory_format_opt());
    }

    /* The allocator allocateTensor uses (it lives as long as the process; the pointer is not owned). */
    std::shared_ptr<c10::Allocator> getMemAllocator() override
    {
        return std::shared_ptr<c10::Allocator>(allocator_, [](c10::Allocator *) {});
    }

    /* torch_colld.colld_memory(): this group's allocator for every CPU allocation until pop. */
    c10::Allocator *cpu_allocator(size_t min_bytes)
    {
        return ColldAllocator::for_client(client_, min_bytes);
    }

    /* run_inline's counters: {completed on the caller's thread, handed to the worker}. */
    std::pair<uint64_t, uint64_t> inline_stats() const
    {
        return { inline_done_.load(std::memory_order_relaxed), inline_handed_.load(std::memory_order_relaxed) };
    }

    /* The colld client's zero-copy and staging counters (colld_client_stats). */
    colld_client_stats_t client_stats()
    {
        colld_client_stats_t st{};
        st.size = sizeof(st);
        (void)colld_client_stats(client_.get(), &st);
        return st;
    }

    /* ---- collectives ---- */

    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                             const c10d::AllreduceOptions &opts) override
    {
        const at::Tensor &t = single("allreduce", tensors);
        colld_dtype_t dt = reduce_dtype("allreduce", t);
        RedOp op = reduce_op("allreduce", opts.reduceOp, t.scalar_type());
        at::Tensor buf = dense(t);
        Op o = make("allreduce", c10d::OpType::ALLREDUCE, tensors);
        o.keep = { buf };
        o.issue = [buf, dt, op](colld_comm_t *c, void *st) {
            return with_op(c, op, dt, [&](colld_redop_t cop) {
                return colld_allreduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), dt, cop, c, st);
            });
        };
        o.done = copy_back(t, buf);
        return post(std::move(o));
    }

    /* Several all-reduces in one colld group (one round through the daemon). */
    c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor> &tensors,
                                                       const c10d::AllreduceCoalescedOptions &opts) override
    {
        std::vector<RedOp> ops;
        std::vector<at::Tensor> bufs;
        std::vector<colld_dtype_t> dts;
        std::vector<std::function<void()>> backs;
        for (const at::Tensor &t : tensors) {
            check_cpu("allreduce_coalesced", t);
            dts.push_back(reduce_dtype("allreduce_coalesced", t));
            ops.push_back(reduce_op("allreduce_coalesced", opts.reduceOp, t.scalar_type()));
            bufs.push_back(dense(t));
            backs.push_back(copy_back(t, bufs.back()));
        }
        Op o = make("allreduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, tensors);
        o.keep = bufs;
        o.issue = [bufs, dts, ops](colld_comm_t *c, void *st) {
            return grouped(bufs.size(), [&](size_t i) {
                return with_op(c, ops[i], dts[i], [&](colld_redop_t cop) {
                    return colld_allreduce(bufs[i].data_ptr(), bufs[i].data_ptr(), bufs[i].numel(), dts[i], cop, c, st);
                });
            });
        };
        o.done = all_of(std::move(backs));
        return post(std::move(o));
    }

    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                             const c10d::BroadcastOptions &opts) override
    {
        const at::Tensor &t = single("broadcast", tensors);
        int root = check_root("broadcast", opts.rootRank, opts.rootTensor);
        at::Tensor buf = dense(t);
        Op o = make("broadcast", c10d::OpType::BROADCAST, tensors);
        o.keep = { buf };
        o.issue = [buf, root](colld_comm_t *c, void *st) {
            return colld_broadcast(buf.data_ptr(), buf.data_ptr(), nbytes(buf), COLLD_UINT8, root, c, st);
        };
        o.done = copy_back(t, buf);
        return post(std::move(o));
    }

    c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors, const c10d::ReduceOptions &opts) override
    {
        const at::Tensor &t = single("reduce", tensors);
        int root = check_root("reduce", opts.rootRank, opts.rootTensor);
        colld_dtype_t dt = reduce_dtype("reduce", t);
        RedOp op = reduce_op("reduce", opts.reduceOp, t.scalar_type());
        at::Tensor buf = dense(t);
        Op o = make("reduce", c10d::OpType::REDUCE, tensors);
        o.keep = { buf };
        o.issue = [buf, dt, op, root](colld_comm_t *c, void *st) {
            return with_op(c, op, dt, [&](colld_redop_t cop) {
                return colld_reduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), dt, cop, root, c, st);
            });
        };
        if (root == rank_)
            o.done = copy_back(t, buf);
        return post(std::move(o));
    }

    /* The list form: each rank's tensor lands in outputs[0][rank], through one staging tensor. */
    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                             std::vector<at::Tensor> &inputs,
                                             const c10d::AllgatherOptions & /* opts */) override
    {
        const at::Tensor &in = single("allgather", inputs);
        TORCH_CHECK(outputs.size() == 1, "torch_colld: allgather: expects one output list, got ", outputs.size());
        check_list("allgather", outputs[0], in);
        at::Tensor src = dense(in);
        at::Tensor flat = at::empty({ static_cast<int64_t>(size_) * in.numel() }, in.options());
        Op o = make("allgather", c10d::OpType::ALLGATHER, outputs[0]);
        o.keep = { src, flat };
        o.issue = [src, flat](colld_comm_t *c, void *st) {
            return colld_allgather(src.data_ptr(), flat.data_ptr(), nbytes(src), COLLD_UINT8, c, st);
        };
        o.done = scatter_back(outputs[0], flat);
        return post(std::move(o));
    }

    /* all_gather_into_tensor: one flat output of size * the input. */
    c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                   const c10d::AllgatherOptions & /* opts */) override
    {
        check_cpu("_allgather_base", input);
        check_cpu("_allgather_base", output);
        check_flat("_allgather_base", output, input, static_cast<int64_t>(size_) * input.numel());
        at::Tensor src = dense(input);
        at::Tensor dst = dense(output);
        std::vector<at::Tensor> outs{ output };
        Op o = make("_allgather_base", c10d::OpType::_ALLGATHER_BASE, outs);
        o.keep = { src, dst };
        o.issue = [src, dst](colld_comm_t *c, void *st) {
            return colld_allgather(src.data_ptr(), dst.data_ptr(), nbytes(src), COLLD_UINT8, c, st);
        };
        o.done = copy_back(output, dst);
        return post(std::move(o));
    }

    /* outputs[0][r][i] gets rank r's inputs[i]: one all-gather per input, in one colld group. */
    c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>> &outputs,
                                                       std::vector<at::Tensor> &inputs,
                                                       const c10d::AllgatherOptions & /* opts */) override
    {
        TORCH_CHECK(outputs.size() == static_cast<size_t>(size_), "torch_colld: allgather_coalesced: expects ", size_,
                    " output lists (one per rank), got ", outputs.size());
        std::vector<at::Tensor> srcs, flats;
        for (size_t i = 0; i < inputs.size(); i++) {
            check_cpu("allgather_coalesced", inputs[i]);
            srcs.push_back(dense(inputs[i]));
            flats.push_back(at::empty({ static_cast<int64_t>(size_) * inputs[i].numel() }, inputs[i].options()));
        }
        std::vector<at::Tensor> all;
        for (auto &list : outputs) {
            TORCH_CHECK(list.size() == inputs.size(), "torch_colld: allgather_coalesced: an output list holds ",
                        list.size(), " tensors, the input list ", inputs.size());
            for (size_t i = 0; i < list.size(); i++) {
                check_cpu("allgather_coalesced", list[i]);
                TORCH_CHECK(list[i].numel() == inputs[i].numel() && list[i].scalar_type() == inputs[i].scalar_type(),
                            "torch_colld: allgather_coalesced: output ", i, " does not match input ", i,
                            " in size or dtype");
                all.push_back(list[i]);
            }
        }
        Op o = make("allgather_coalesced", c10d::OpType::ALLGATHER_COALESCED, all);
        o.keep = srcs;
        o.keep.insert(o.keep.end(), flats.begin(), flats.end());
        o.issue = [srcs, flats](colld_comm_t *c, void *st) {
            return grouped(srcs.size(), [&](size_t i) {
                return colld_allgather(srcs[i].data_ptr(), flats[i].data_ptr(), nbytes(srcs[i]), COLLD_UINT8, c, st);
            });
        };
        std::vector<std::vector<at::Tensor>> outs = outputs;
        o.done = [outs, flats] {
            for (size_t r = 0; r < outs.size(); r++)
                for (size_t i = 0; i < outs[r].size(); i++) {
                    int64_t n = outs[r][i].numel();
                    outs[r][i].copy_(flats[i].narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r][i].sizes()));
                }
        };
        return post(std::move(o));
    }

    /* The list form: inputs[0][r] is the part for rank r, staged into one contiguous tensor. */
    c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                  std::vector<std::vector<at::Tensor>> &inputs,
                                                  const c10d::ReduceScatterOptions &opts) override
    {
        const at::Tensor &out = single("reduce_scatter", outputs);
        TORCH_CHECK(inputs.size() == 1, "torch_colld: reduce_scatter: expects one input list, got ", inputs.size());
        check_list("reduce_scatter", inputs[0], out);
        colld_dtype_t dt = reduce_dtype("reduce_scatter", out);
        RedOp op = reduce_op("reduce_scatter", opts.reduceOp, out.scalar_type());
        at::Tensor src = flatten(inputs[0]);
        at::Tensor dst = dense(out);
        Op o = make("reduce_scatter", c10d::OpType::REDUCE_SCATTER, outputs);
        o.keep = { src, dst };
        o.issue = [src, dst, dt, op](colld_comm_t *c, void *st) {
            return with_op(c, op, dt, [&](colld_redop_t cop) {
                return colld_reducescatter(src.data_ptr(), dst.data_ptr(), dst.numel(), dt, cop, c, st);
            });
        };
        o.done = copy_back(out, dst);
        return post(std::move(o));
    }

    /* reduce_scatter_tensor: one flat input of size * the output. */
    c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                                                        const c10d::ReduceScatterOptions &opts) override
    {
        check_cpu("_reduce_scatter_base", input);
        check_cpu("_reduce_scatter_base", output);
        check_flat("_reduce_scatter_base", input, output, static_cast<int64_t>(size_) * output.numel());
        colld_dtype_t dt = reduce_dtype("_reduce_scatter_base", output);
        RedOp op = reduce_op("_reduce_scatter_base", opts.reduceOp, output.scalar_type());
        at::Tensor src = dense(input);
        at::Tensor dst = dense(output);
        std::vector<at::Tensor> outs{ output };
        Op o = make("_reduce_scatter_base", c10d::OpType::_REDUCE_SCATTER_BASE, outs);
        o.keep = { src, dst };
        o.issue = [src, dst, dt, op](colld_comm_t *c, void *st) {
            return with_op(c, op, dt, [&](colld_redop_t cop) {
                return colld_reducescatter(src.data_ptr(), dst.data_ptr(), dst.numel(), dt, cop, c, st);
            });
        };
        o.done = copy_back(output, dst);
        return post(std::move(o));
    }

    /* all_gather_into_tensor under torch.distributed._coalescing_manager (FSDP's): outputs[i] gets
     * every rank's inputs[i], one colld_allgather each, in one colld group. */
    c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor> &outputs,
                                                                   std::vector<at::Tensor> &inputs,
                                                                   const c10d::AllgatherOptions & /* opts */) override
    {
        const char *op = "allgather_into_tensor_coalesced";
        TORCH_CHECK(outputs.size() == inputs.size(), "torch_colld: ", op, ": ", outputs.size(), " outputs for ",
                    inputs.size(), " inputs");
        std::vector<at::Tensor> srcs, dsts;
        std::vector<std::function<void()>> backs;
        for (size_t i = 0; i < inputs.size(); i++) {
            check_cpu(op, inputs[i]);
            check_cpu(op, outputs[i]);
            check_flat(op, outputs[i], inputs[i], static_cast<int64_t>(size_) * inputs[i].numel());
            srcs.push_back(dense(inputs[i]));
            dsts.push_back(dense(outputs[i]));
            backs.push_back(copy_back(outputs[i], dsts.back()));
        }
        Op o = make(op, c10d::OpType::COALESCED, outputs);
        o.keep = srcs;
        o.keep.insert(o.keep.end(), dsts.begin(), dsts.end());
        o.issue = [srcs, dsts](colld_comm_t *c, void *st) {
            return grouped(srcs.size(), [&](size_t i) {
                return colld_allgather(srcs[i].data_ptr(), dsts[i].data_ptr(), nbytes(srcs[i]), COLLD_UINT8, c, st);
            });
        };
        o.done = all_of(std::move(backs));
        return post(std::move(o));
    }

    /* reduce_scatter_tensor under torch.distributed._coalescing_manager: outputs[i] gets its part
     * of the reduction of every rank's inputs[i], one colld_reducescatter each, in one colld group. */
    c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor> &outputs,
                                                                   std::vector<at::Tensor> &inputs,
                                                                   const c10d::ReduceScatterOptions &opts) override
    {
        const char *op = "reduce_scatter_tensor_coalesced";
        TORCH_CHECK(outputs.size() == inputs.size(), "torch_colld: ", op, ": ", outputs.size(), " outputs for ",
                    inputs.size(), " inputs");
        std::vector<at::Tensor> srcs, dsts;
        std::vector<colld_dtype_t> dts;
        std::vector<RedOp> ops;
        std::vector<std::function<void()>> backs;
        for (size_t i = 0; i < inputs.size(); i++) {
            check_cpu(op, inputs[i]);
            check_cpu(op, outputs[i]);
            check_flat(op, inputs[i], outputs[i], static_cast<int64_t>(size_) * outputs[i].numel());
            dts.push_back(reduce_dtype(op, outputs[i]));
            ops.push_back(reduce_op(op, opts.reduceOp, outputs[i].scalar_type()));
            srcs.push_back(dense(inputs[i]));
            dsts.push_back(dense(outputs[i]));
            backs.push_back(copy_back(outputs[i], dsts.back()));
        }
        Op o = make(op, c10d::OpType::COALESCED, outputs);
        o.keep = srcs;
        o.keep.insert(o.keep.end(), dsts.begin(), dsts.end());
        o.issue = [srcs, dsts, dts, ops](colld_comm_t *c, void *st) {
            return grouped(srcs.size(), [&](size_t i) {
                return with_op(c, ops[i], dts[i], [&](colld_redop_t cop) {
                    return colld_reducescatter(srcs[i].data_ptr(), dsts[i].data_ptr(), dsts[i].numel(), dts[i], cop, c,
                                               st);
                });
            });
        };
        o.done = all_of(std::move(backs));
        return post(std::move(o));
    }

    /* colld_barrier: it completes once every rank has called it. */
    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions & /* opts */) override
    {
        Op o = make("barrier", c10d::OpType::BARRIER, {});
        o.issue = [](colld_comm_t *c, void * /* st */) { return colld_barrier(c); };
        return post(std::move(o));
    }

    /* outputs[0][r] on the root gets rank r's input (no outputs elsewhere), staged in one tensor. */
    c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outputs,
                                          std::vector<at::Tensor> &inputs, const c10d::GatherOptions &opts) override
    {
        const at::Tensor &in = single("gather", inputs);
        int root = check_root("gather", opts.rootRank, 0);
        at::Tensor src = dense(in);
        at::Tensor flat;
        std::vector<at::Tensor> outs;
        if (root == rank_) {
            TORCH_CHECK(outputs.size() == 1, "torch_colld: gather: the root expects one output list, got ",
                        outputs.size());
            check_list("gather", outputs[0], in);
            outs = outputs[0];
            flat = at::empty({ static_cast<int64_t>(size_) * in.numel() }, in.options());
        } else {
            TORCH_CHECK(outputs.empty(), "torch_colld: gather: only the root (rank ", root, ") takes an output list");
        }
        Op o = make("gather", c10d::OpType::GATHER, outs);
        o.keep = { src, flat };
        o.issue = [src, flat, root](colld_comm_t *c, void *st) {
            return colld_gather(src.data_ptr(), flat.defined() ? flat.data_ptr() : nullptr, nbytes(src), COLLD_UINT8,
                                root, c, st);
        };
        if (root == rank_)
            o.done = scatter_back(outs, flat);
        return post(std::move(o));
    }

    /* outputs[0] gets the root's inputs[0][rank] (no inputs elsewhere), staged in one tensor. */
    c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outputs,
                                           std::vector<std::vector<at::Tensor>> &inputs,
                                           const c10d::ScatterOptions &opts) override
    {
        const at::Tensor &out = single("scatter", outputs);
        int root = check_root("scatter", opts.rootRank, 0);
        at::Tensor src;
        if (root == rank_) {
            TORCH_CHECK(inputs.size() == 1, "torch_colld: scatter: the root expects one input list, got ",
                        inputs.size());
            check_list("scatter", inputs[0], out);
            src = flatten(inputs[0]);
        } else {
            TORCH_CHECK(inputs.empty(), "torch_colld: scatter: only the root (rank ", root, ") takes an input list");
        }
        at::Tensor dst = dense(out);
        Op o = make("scatter", c10d::OpType::SCATTER, outputs);
        o.keep = { src, dst };
        o.issue = [src, dst, root](colld_comm_t *c, void *st) {
            return colld_scatter(src.defined() ? src.data_ptr() : nullptr, dst.data_ptr(), nbytes(dst), COLLD_UINT8,
                                 root, c, st);
        };
        o.done = copy_back(out, dst);
        return post(std::move(o));
    }

    /* all_to_all_single: the input's rows in_splits[q] (after those for the ranks before q) go to
     * rank q, and rank q's land in the output's rows out_splits[q]; a side without split sizes is
     * split in equal parts. Always colld_alltoallv, in bytes, even for equal parts: colld_alltoall
     * is a collective and colld_alltoallv sends and receives, so a rank that took one would never
     * meet a rank that took the other (one giving split sizes, another not), and the two measured
     * alike here. Input and output may be the same tensor (the input is copied first). */
    c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                                 std::vector<int64_t> &out_splits, std::vector<int64_t> &in_splits,
                                                 const c10d::AllToAllOptions & /* opts */) override
    {
        check_cpu("all_to_all_single", input);
        check_cpu("all_to_all_single", output);
        TORCH_CHECK(input.scalar_type() == output.scalar_type(),
                    "torch_colld: all_to_all_single: input and output dtypes differ (", input.scalar_type(), ", ",
                    output.scalar_type(), ")");
        Layout send = split_layout("input", in_splits, input);
        Layout recv = split_layout("output", out_splits, output);
        TORCH_CHECK(send.row == recv.row, "torch_colld: all_to_all_single: an input row holds ", send.row,
                    " bytes, an output row ", recv.row, ": both tensors must have the same size past dimension 0");
        at::Tensor src = input.contiguous();
        at::Tensor dst = dense(output);
        if (overlap(src, dst))
            src = src.clone(); /* all-to-all has no in-place form */
        std::vector<at::Tensor> outs{ output };
        Op o = make("all_to_all_single", c10d::OpType::ALLTOALL_BASE, outs);
        o.keep = { src, dst };
        o.hint = kAlltoallvHint;
        o.issue = alltoallv(src, std::move(send), dst, std::move(recv));
        o.done = copy_back(output, dst);
        return post(std::move(o));
    }

    /* all_to_all (lists): inputs[q] goes to rank q, rank q's lands in outputs[q]; the tensors may
     * differ in size (one dtype for all). Both lists are staged in one contiguous tensor each and
     * moved with colld_alltoallv, in bytes, whatever the sizes: whether another rank's tensors
     * are equal is not known here, and every rank must make the same call. */
    c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
                                            const c10d::AllToAllOptions & /* opts */) override
    {
        const char *op = "all_to_all";
        TORCH_CHECK(inputs.size() == static_cast<size_t>(size_) && outputs.size() == static_cast<size_t>(size_),
                    "torch_colld: all_to_all: expects ", size_, " input and ", size_,
                    " output tensors (one per rank), got ", inputs.size(), " and ", outputs.size());
        Layout send, recv;
        for (const at::Tensor &t : inputs)
            add_to_layout(send, t, inputs[0]);
        for (const at::Tensor &t : outputs)
            add_to_layout(recv, t, inputs[0]);
        at::Tensor src = flatten(inputs);
        at::Tensor flat = at::empty({ static_cast<int64_t>(recv.total / inputs[0].element_size()) },
                                    inputs[0].options());
        Op o = make(op, c10d::OpType::ALLTOALL, outputs);
        o.keep = { src, flat };
        o.hint = kAlltoallvHint;
        o.issue = alltoallv(src, std::move(send), flat, std::move(recv));
        o.done = scatter_back(outputs, flat);
        return post(std::move(o));
    }

    /* ---- point-to-point ---- */

    /* Sends the tensor to rank dst with colld_send (its bytes, as uint8). colld matches the k-th
     * send a->b with the k-th receive b<-a and has no tags. With tag 0 the tensor is the whole
     * message; with any other tag the tag goes first (1 x int64, in one colld group with the
     * tensor) and the receive checks it: a program that pairs its sends and receives by tag in
     * another order than it posts them (Gloo allows that) gets a RuntimeError naming both tags
     * instead of the wrong data, and a tagged send never meets an untagged receive (colld
     * refuses the pair as a COLLD_ERR_MISMATCH, int64 against uint8). A send to this rank itself
     * is refused outside batch_isend_irecv: alone it would wait for a receive posted after it. */
    c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dst, int tag) override
    {
        const at::Tensor &t = single("send", tensors);
        check_peer("send", "to", dst);
        TORCH_CHECK(tag == 0 || !t.is_cuda(), "torch_colld: send: tags are not supported on CUDA tensors (tag ", tag,
                    "; torch_colld checks a tag on the host, which a stream-ordered receive cannot)");
        at::Tensor buf = t.contiguous();
        Op o = make("send", c10d::OpType::SEND, tensors);
        o.hint = kP2PHint;
        o.keep = { buf };
        if (tag == 0) {
            o.issue = [buf, dst](colld_comm_t *c, void *st) {
                return colld_send(buf.data_ptr(), nbytes(buf), COLLD_UINT8, dst, c, st);
            };
        } else {
            at::Tensor hdr = at::full({ 1 }, static_cast<int64_t>(tag), at::TensorOptions().dtype(at::kLong));
            o.keep.push_back(hdr);
            o.issue = [buf, hdr, dst](colld_comm_t *c, void *st) {
                return grouped(2, [&](size_t i) {
                    return i == 0 ? colld_send(hdr.data_ptr(), 1, COLLD_INT64, dst, c, st)
                                  : colld_send(buf.data_ptr(), nbytes(buf), COLLD_UINT8, dst, c, st);
                });
            };
        }
        return post(std::move(o));
    }

    /* Receives the tensor from rank src (colld_recv): the next send from src, which must have
     * the same size in bytes and, where a tag is given, the same tag (send() says how). */
    c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int src, int tag) override
    {
        const at::Tensor &t = single("recv", tensors);
        check_peer("recv", "from", src);
        TORCH_CHECK(tag == 0 || !t.is_cuda(), "torch_colld: recv: tags are not supported on CUDA tensors (tag ", tag,
                    "; torch_colld checks a tag on the host, which a stream-ordered receive cannot)");
        at::Tensor buf = dense(t);
        Op o = make("recv", c10d::OpType::RECV, tensors, src);
        o.hint = kP2PHint;
        o.keep = { buf };
        if (tag == 0) {
            o.issue = [buf, src](colld_comm_t *c, void *st) {
                return colld_recv(buf.data_ptr(), nbytes(buf), COLLD_UINT8, src, c, st);
            };
        } else {
            at::Tensor hdr = at::zeros({ 1 }, at::TensorOptions().dtype(at::kLong));
            o.keep.push_back(hdr);
            o.issue = [buf, hdr, src](colld_comm_t *c, void *st) {
                return grouped(2, [&](size_t i) {
                    return i == 0 ? colld_recv(hdr.data_ptr(), 1, COLLD_INT64, src, c, st)
                                  : colld_recv(buf.data_ptr(), nbytes(buf), COLLD_UINT8, src, c, st);
                });
            };
            o.check = [hdr, src, tag]() -> std::string {
                int64_t got = hdr.data_ptr<int64_t>()[0];
                if (got == tag)
                    return "";
                return "torch_colld: recv from rank " + std::to_string(src) + " with tag " + std::to_string(tag) +
                       " got the message rank " + std::to_string(src) + " sent with tag " + std::to_string(got) +
                       ": colld matches a pair of ranks' sends and receives in the order they are posted, tags "
                       "are only checked (post them in the same order on both ranks)";
            };
        }
        o.done = copy_back(t, buf);
        return post(std::move(o));
    }

    /* colld_recv names its sender: there is no receive from any source (as NCCL's backend). */
    c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor> &, int) override
    {
        TORCH_CHECK(false, "torch_colld: recv from any source (src=None) is not supported: colld matches every "
                           "receive with one named sender (colld_recv has no any-source form); pass src=, or use "
                           "the gloo backend for it");
    }

    /* batch_isend_irecv calls startCoalescing, then isend/irecv for each P2POp, then
     * endCoalescing, because supportsCoalescing() says so (torch 2.x runs a batch one operation
     * after the other on a backend that does not, and a ring exchange would then wait forever);
     * so does torch.distributed._coalescing_manager(group, device). */
    bool supportsCoalescing() const override
    {
        return true;
    }

    /* The operations posted from here to endCoalescing (by any thread, on this group) are held
     * back and queued at the end as one batch, which the worker issues in one colld group: its
     * sends and receives run concurrently (after its collectives, as colld orders a group), so
     * ranks that exchange with each other never wait on each other. Nests: only the outermost
     * end queues the batch. */
    void startCoalescing() override
    {
        std::lock_guard<std::mutex> lock(mu_);
        TORCH_CHECK(!stop_, "torch_colld: _start_coalescing: the process group was shut down");
        if (coalescing_++ == 0)
            batch_work_ = c10::make_intrusive<WorkColld>(rank_, c10d::OpType::COALESCED, std::vector<at::Tensor>{},
                                                         work_done_);
    }

    /* Queues the batch; returns its one Work (batch_isend_irecv's only request in torch 2.x),
     * completed once every operation of the batch has, with the first failure among them. Its
     * future's value is every tensor of the batch. An empty batch's Work is complete at once. */
    c10::intrusive_ptr<c10d::Work> endCoalescing() override
    {
        c10::intrusive_ptr<WorkColld> w;
        bool queued = false;
        std::shared_ptr<std::promise<std::string>> issued; /* a CUDA batch's */
        std::vector<std::function<void()>> dones;
        std::vector<c10::intrusive_ptr<WorkColld>> works;
        {
            std::lock_guard<std::mutex> lock(mu_);
            TORCH_CHECK(!stop_, "torch_colld: _end_coalescing: the process group was shut down");
            TORCH_CHECK(coalescing_ > 0, "torch_colld: _end_coalescing without _start_coalescing");
            w = batch_work_;
            if (--coalescing_ > 0)
                return w;
            batch_work_.reset();
            if (!batch_.empty()) {
                Op batch; /* straight into the queue: post() would hold it if another thread coalesces */
                batch.name = "batch_isend_irecv";
                batch.parts.swap(batch_);
                std::vector<at::Tensor> all;
                for (const Op &p : batch.parts) {
                    TORCH_CHECK(p.device == batch.parts[0].device,
                                "torch_colld: batch_isend_irecv: its tensors are on ", batch.parts[0].device, " and ",
                                p.device, ": all must be on one device");
                    for (const at::Tensor &t : p.work->result())
                        all.push_back(t);
#ifdef COLLD_TORCH_CUDA
                    dones.push_back(p.done);
                    works.push_back(p.work);
#endif
                }
                w->set_outputs(std::move(all));
                batch.work = w;
                if (batch.parts[0].device.is_cuda()) { /* the parts' works are completed by this thread below */
                    batch.issued = issued = std::make_shared<std::promise<std::string>>();
                    works.push_back(w);
                    dones.push_back(nullptr);
                }
                queue_.push_back(std::move(batch));
                queued_.store(queue_.size(), std::memory_order_release);
                queued = true;
            }
        }
        if (queued)
            cv_.notify_one();
        else
            w->complete("");
#ifdef COLLD_TORCH_CUDA
        if (issued)
            finish_on_stream(wait_issued(issued), dones, works);
#endif
        return w;
    }

    /* ---- split_group ---- */

    /* torch.distributed.split_group (torch 2.x) asks the parent group's backend for it. */
    bool supportsSplitting() const override
    {
        return true;
    }

    /* What torch's ProcessGroup::splitGroup starts from when split_group is given no pg_options,
     * and what split_group itself copies (the Python property `options`): the group's timeout. */
    c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override
    {
        return c10::make_intrusive<Options>(timeout_);
    }

    /* split_group: every rank of this group calls it (torch's split_group on each), `ranks` being
     * the ranks of this group in its split, sorted (torch sorts them); a rank in no split gets
     * the first split, without itself. One colld_comm_split on this group's communicator, on its
     * worker thread after the operations posted before: color = the lowest rank of the split,
     * key = this rank's place in `ranks`, so the new group's ranks follow `ranks`; a rank in no
     * split passes COLLD_SPLIT_NOCOLOR and gets nullptr (torch then returns None). The new group
     * is a ProcessGroupColld of its own (worker thread, timeout: opts' timeout, which is
     * split_group's `timeout` or this group's) on the new communicator; the store is not needed.
     *
     * colld_comm_split groups ranks by color, whatever they were told, so first every rank's
     * split is all-gathered on this group and checked by every rank alike: a rank in two splits,
     * splits that differ between ranks, or a rank out of range fail on every rank with the same
     * RuntimeError, and no rank splits (none waits for a rank that will not). torch calls split
     * once per device of the group, with one store made for that split_group; where one backend
     * serves both CPU and CUDA ("cpu:colld,cuda:colld", or the CUDA build), the second call (the
     * same store) gets the same new group back. */
    c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store> &store, const std::vector<int> &ranks,
                                            const c10::intrusive_ptr<c10d::Backend::Options> &opts) override
    {
        {
            std::lock_guard<std::mutex> lock(mu_);
            TORCH_CHECK(coalescing_ == 0, "torch_colld: split_group inside a coalescing block (batch_isend_irecv, "
                                          "_coalescing_manager) of the parent group: split outside it");
            if (store && split_store_.lock().get() == store.get())
                return split_last_.lock(); /* none: this rank is in no split */
        }
        std::chrono::milliseconds timeout = opts ? opts->timeout : timeout_;
        TORCH_CHECK(timeout.count() >= 0, "torch_colld: split_group: negative timeout");
        std::string local; /* why `ranks` is not a split of this group, if it is not */
        int key = -1, color = COLLD_SPLIT_NOCOLOR;
        std::set<int> seen;
        for (size_t i = 0; i < ranks.size() && local.empty(); i++) {
            int r = ranks[i];
            if (r < 0 || r >= size_)
                local = "rank " + std::to_string(r) + " is not in [0, " + std::to_string(size_) + ")";
            else if (!seen.insert(r).second)
                local = "rank " + std::to_string(r) + " is in it twice";
            if (r == rank_)
                key = static_cast<int>(i);
        }
        if (ranks.empty())
            local = "it is empty";
        if (local.empty() && key >= 0)
            color = *seen.begin();
        /* This rank's claim: {state (1: in the split, 0: in none, -1: not valid), color, ranks
         * in the split, a hash of them in order}. */
        at::Tensor mine = at::empty({ kClaim }, at::kLong);
        at::Tensor all = at::empty({ static_cast<int64_t>(size_) * kClaim }, at::kLong);
        int64_t *m = mine.data_ptr<int64_t>();
        m[0] = !local.empty() ? -1 : key >= 0 ? 1 : 0;
        m[1] = color;
        m[2] = static_cast<int64_t>(ranks.size());
        m[3] = hash_ranks(ranks);
        auto made = std::make_shared<colld_comm_t *>(nullptr);
        Op o;
        o.name = "split_group";
        o.may_inline = false; /* its check splits the communicator: on the worker, as documented */
        o.work = c10::make_intrusive<WorkColld>(rank_, c10d::OpType::UNKNOWN, std::vector<at::Tensor>{}, work_done_);
        o.keep = { mine, all };
        o.issue = [mine, all](colld_comm_t *c, void *st) {
            return colld_allgather(mine.data_ptr(), all.data_ptr(), kClaim, COLLD_INT64, c, st);
        };
        /* On the worker, once every claim is here. */
        o.check = [this, all, local, color, key, n = static_cast<int>(ranks.size()), timeout, made]() {
            std::string why = check_claims(all, local);
            if (!why.empty())
                return why;
            colld_comm_config_t cfg = comm_config(timeout);
            colld_status_t st = colld_comm_split(comm_, color, key, made.get(), &cfg);
            if (st != COLLD_OK)
                return colld_failure("split_group (colld_comm_split)", st, colld_comm_last_error(comm_));
            int got_n = 0, got_rank = -1;
            if (*made && (colld_comm_count(*made, &got_n) != COLLD_OK ||
                          colld_comm_user_rank(*made, &got_rank) != COLLD_OK || got_n != n || got_rank != key)) {
                colld_comm_destroy(*made);
                *made = nullptr;
                return "torch_colld: split_group: colld_comm_split made a communicator of " + std::to_string(got_n) +
                       " ranks with this rank as " + std::to_string(got_rank) + ", not " + std::to_string(n) +
                       " ranks with it as " + std::to_string(key);
            }
            return std::string();
        };
        c10::intrusive_ptr<c10d::Work> w = post(std::move(o));
        if (Py_IsInitialized() && PyGILState_Check()) {
            pybind11::gil_scoped_release nogil;
            w->wait();
        } else {
            w->wait();
        }
        c10::intrusive_ptr<ProcessGroupColld> child;
        if (*made)
            child = c10::make_intrusive<ProcessGroupColld>(client_, *made, key, static_cast<int>(ranks.size()),
                                                           timeout);
        std::lock_guard<std::mutex> lock(mu_);
        split_store_ = c10::weak_intrusive_ptr<c10d::Store>(store);
        split_last_ = c10::weak_intrusive_ptr<c10d::Backend>(c10::intrusive_ptr<c10d::Backend>(child));
        return child;
    }

    /* The options split_group copies and hands back (Backend.Options cannot be copied by Python's
     * copy.deepcopy; these can): the group's timeout. */
    struct Options : c10d::Backend::Options {
        explicit Options(std::chrono::milliseconds t) : c10d::Backend::Options("colld", t)
        {
        }
    };

  private:
    static constexpr int64_t kClaim = 4; /* int64s in a rank's claim (split()) */

    /* FNV-1a of a split's ranks, in order. */
    static int64_t hash_ranks(const std::vector<int> &ranks)
    {
        uint64_t h = 1469598103934665603ull;
        for (int r : ranks)
            for (int b = 0; b < 32; b += 8) {
                h ^= (static_cast<uint32_t>(r) >> b) & 0xff;
                h *= 1099511628211ull;
            }
        int64_t out;
        std::memcpy(&out, &h, sizeof(out));
        return out;
    }

    /* Every rank's claim (split()), the same on every rank: empty when the claims form a
     * partition of some of the ranks (each split claimed by exactly its ranks, with one list),
     * else why not, the same text on every rank (but for `local`, this rank's own reason). */
    std::string check_claims(const at::Tensor &all, const std::string &local) const
    {
        const int64_t *c = all.data_ptr<int64_t>();
        const char *rule = " (each rank may be in one split only, and every rank must pass the same split_ranks)";
        for (int r = 0; r < size_; r++)
            if (c[r * kClaim] < 0)
                return "torch_colld: split_group: rank " + std::to_string(r) +
                       " of the parent group was given a split that is not valid" +
                       (r == rank_ ? ": " + local : std::string(" (its error says why)"));
        for (int r = 0; r < size_; r++) {
            const int64_t *a = c + r * kClaim;
            if (a[0] != 1)
                continue;
            std::string joined;
            int64_t count = 0;
            for (int q = 0; q < size_; q++) {
                const int64_t *b = c + q * kClaim;
                if (b[0] != 1 || b[1] != a[1])
                    continue;
                if (b[2] != a[2] || b[3] != a[3])
                    return "torch_colld: split_group: ranks " + std::to_string(r) + " and " + std::to_string(q) +
                           " of the parent group were given different splits starting at rank " + std::to_string(a[1]) +
                           rule;
                joined += (count++ ? ", " : "") + std::to_string(q);
            }
            if (count != a[2])
                return "torch_colld: split_group: rank " + std::to_string(r) +
                       " of the parent group was given a split of " + std::to_string(a[2]) +
                       " ranks starting at rank " + std::to_string(a[1]) + ", which only " + std::to_string(count) +
                       " joined (" + joined + ")" + rule;
        }
        return "";
    }

    /* A communicator's configuration: named torch_colld in collctl, with the group's timeout. */
    static colld_comm_config_t comm_config(std::chrono::milliseconds timeout)
    {
        colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
        cfg.name = "torch_colld";
        cfg.timeout_ms = timeout.count() > INT_MAX ? INT_MAX : static_cast<int>(timeout.count());
        return cfg;
    }

    /* Once the communicator is there: start the worker, and count the group among the live ones. */
    void start()
    {
        const char *b = std::getenv("TORCH_COLLD_DDP_BUCKETS");
        ddp_buckets_ = !(b && std::strcmp(b, "0") == 0);
        allocator_ = ColldAllocator::for_client(client_, 0);
        const char *ib = std::getenv("TORCH_COLLD_INLINE_BYTES");
        char *end = nullptr;
        unsigned long long n = ib ? std::strtoull(ib, &end, 10) : 0;
        if (ib && end != ib && *end == '\0')
            inline_bytes_ = static_cast<size_t>(n);

        init();
        worker_ = std::thread([this] { run(); });
        std::lock_guard<std::mutex> lock(g_live_mu);
        g_live.insert(this);
    }

    /* stop() without the GIL. */
    void stop_worker(bool abort)
    {
        bool busy;
        std::vector<Op> held;
        c10::intrusive_ptr<WorkColld> held_work;
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
            /* running: on the worker, on a caller's thread, or issued there and queued for the worker */
            busy = busy_ || inline_ || (!queue_.empty() && queue_.front().issued_inline);
            held.swap(batch_); /* posted inside a batch_isend_irecv that never ended */
            held_work.swap(batch_work_);
            coalescing_ = 0;
        }
        for (Op &o : held)
            fail(o, "the process group was stopped before its batch was posted");
        if (held_work)
            held_work->complete("torch_colld: batch: the process group was stopped before its batch was posted");
        cv_.notify_all();
        if (abort && busy && comm_)
            colld_comm_abort(comm_);
        std::lock_guard<std::mutex> lock(join_mu_);
        if (worker_.joinable())
            worker_.join();
        std::unique_lock<std::mutex> inl(mu_); /* a caller's thread may still have the communicator */
        cv_.wait(inl, [this] { return !inline_; });
    }

    /* Stop the worker and destroy the communicator, once (shutdown, abort, the destructor). The
     * colld client stays: tensors from empty() may still use its memory. */
    void release(bool abort)
    {
        stop(abort);
        std::lock_guard<std::mutex> lock(join_mu_);
        if (comm_) {
            /* As ProcessGroupNCCL's shutdown: what was issued on CUDA streams finishes first
             * (bounded by the timeout; a broken communicator returns at once), or the peers'
             * matching sends and receives would fail with it. Host operations are done already. */
            if (!abort) {
                if (Py_IsInitialized() && PyGILState_Check()) {
                    pybind11::gil_scoped_release nogil;
                    (void)colld_comm_synchronize(comm_);
                } else {
                    (void)colld_comm_synchronize(comm_);
                }
            }
            colld_comm_destroy(comm_);
            comm_ = nullptr;
        }
    }

    /* Where a tensor's parts for (or from) each rank lie in its bytes: colld_alltoallv's counts
     * and displacements, in bytes. `row`: the bytes of one row (dimension 0) where it was split
     * by rows. */
    struct Layout {
        std::vector<size_t> counts, displs;
        size_t total = 0;
        size_t row = 0;
    };

    /* The layout of `t` split along dimension 0 into splits[q] rows for rank q (none given:
     * equal parts). */
    Layout split_layout(const char *which, const std::vector<int64_t> &splits, const at::Tensor &t)
    {
        TORCH_CHECK(t.dim() >= 1, "torch_colld: all_to_all_single: the ", which,
                    " tensor has no dimension to split (0-dimensional)");
        Layout l;
        l.row = t.element_size();
        for (int64_t d = 1; d < t.dim(); d++)
            l.row *= static_cast<size_t>(t.size(d));
        int64_t rows = t.size(0);
        std::vector<int64_t> s = splits;
        if (s.empty()) {
            TORCH_CHECK(rows % size_ == 0, "torch_colld: all_to_all_single: the ", which, "'s ", rows,
                        " rows do not split evenly between ", size_, " ranks (give its split sizes)");
            s.assign(size_, rows / size_);
        }
        TORCH_CHECK(s.size() == static_cast<size_t>(size_), "torch_colld: all_to_all_single: ", s.size(), " ", which,
                    " split sizes for ", size_, " ranks");
        int64_t sum = 0;
        for (int64_t n : s) {
            TORCH_CHECK(n >= 0, "torch_colld: all_to_all_single: negative ", which, " split size ", n);
            sum += n;
        }
        TORCH_CHECK(sum == rows, "torch_colld: all_to_all_single: the ", which, " split sizes add up to ", sum,
                    " rows, the tensor has ", rows);
        for (int64_t n : s) {
            l.counts.push_back(static_cast<size_t>(n) * l.row);
            l.displs.push_back(l.total);
            l.total += l.counts.back();
        }
        return l;
    }

    /* Appends tensor t (of all_to_all's lists, which all have `like`'s dtype) to a layout. */
    static void add_to_layout(Layout &l, const at::Tensor &t, const at::Tensor &like)
    {
        check_cpu("all_to_all", t);
        TORCH_CHECK(t.scalar_type() == like.scalar_type(),
                    "torch_colld: all_to_all: every tensor of both lists must have one dtype (", like.scalar_type(),
                    "), one has ", t.scalar_type());
        l.counts.push_back(nbytes(t));
        l.displs.push_back(l.total);
        l.total += nbytes(t);
    }

    /* Issues colld_alltoallv of src's `send` parts into dst's `recv` parts, as bytes. */
    static std::function<colld_status_t(colld_comm_t *, void *)> alltoallv(const at::Tensor &src, Layout send,
                                                                           const at::Tensor &dst, Layout recv)
    {
        return [src, dst, send = std::move(send), recv = std::move(recv)](colld_comm_t *c, void *st) {
            return colld_alltoallv(src.data_ptr(), send.counts.data(), send.displs.data(), dst.data_ptr(),
                                   recv.counts.data(), recv.displs.data(), COLLD_UINT8, c, st);
        };
    }

    /* Whether two tensors' bytes overlap. */
    static bool overlap(const at::Tensor &a, const at::Tensor &b)
    {
        uintptr_t pa = reinterpret_cast<uintptr_t>(a.data_ptr()), pb = reinterpret_cast<uintptr_t>(b.data_ptr());
        size_t na = nbytes(a), nb = nbytes(b);
        return na && nb && pa < pb + nb && pb < pa + na;
    }

    /* A send's or receive's peer: a rank of the group, and this rank only inside
     * batch_isend_irecv (alone, a send to itself waits for a receive posted after it). */
    void check_peer(const char *op, const char *dir, int peer)
    {
        TORCH_CHECK(peer >= 0 && peer < size_, "torch_colld: ", op, ": rank ", peer, " is not in [0, ", size_, ")");
        bool coalescing;
        {
            std::lock_guard<std::mutex> lock(mu_);
            coalescing = coalescing_ > 0;
        }
        TORCH_CHECK(peer != rank_ || coalescing, "torch_colld: ", op, " ", dir, " this rank itself (", peer,
                    ") works only inside batch_isend_irecv (with the matching ", op[0] == 's' ? "irecv" : "isend",
                    "): alone it would wait for an operation posted after it");
    }

    /* A root rank in range, and tensor 0 (one tensor per process). */
    int check_root(const char *op, int64_t root, int64_t root_tensor)
    {
        TORCH_CHECK(root >= 0 && root < size_, "torch_colld: ", op, ": root rank ", root, " is not in [0, ", size_,
                    ")");
        TORCH_CHECK(root_tensor == 0, "torch_colld: ", op, ": root tensor ", root_tensor,
                    " out of range (one tensor per process)");
        return static_cast<int>(root);
    }

    /* A list of one tensor per rank, each like `like` (same dtype and element count). */
    void check_list(const char *op, const std::vector<at::Tensor> &list, const at::Tensor &like)
    {
        TORCH_CHECK(list.size() == static_cast<size_t>(size_), "torch_colld: ", op, ": expects ", size_,
                    " tensors in the list (one per rank), got ", list.size());
        for (const at::Tensor &t : list) {
            check_cpu(op, t);
            TORCH_CHECK(t.scalar_type() == like.scalar_type() && t.numel() == like.numel(), "torch_colld: ", op,
                        ": every tensor in the list must have the dtype and size of the other tensor (",
                        like.scalar_type(), ", ", like.numel(), " elements), one has ", t.scalar_type(), ", ",
                        t.numel());
        }
    }

    /* The flat buffer of _allgather_base / _reduce_scatter_base: `big` holds `want` elements of
     * `small`'s dtype. */
    static void check_flat(const char *op, const at::Tensor &big, const at::Tensor &small, int64_t want)
    {
        TORCH_CHECK(big.scalar_type() == small.scalar_type(), "torch_colld: ", op, ": input and output dtypes differ (",
                    small.scalar_type(), ", ", big.scalar_type(), ")");
        TORCH_CHECK(big.numel() == want, "torch_colld: ", op, ": the flat tensor must hold world size x ",
                    small.numel(), " = ", want, " elements, it holds ", big.numel());
    }

    /* One contiguous tensor holding a list's tensors one after the other. */
    static at::Tensor flatten(const std::vector<at::Tensor> &list)
    {
        std::vector<at::Tensor> parts;
        for (const at::Tensor &p : list)
            parts.push_back(p.reshape({ -1 }));
        return at::cat(parts);
    }

    /* Copies the blocks of a staged flat result into the list's tensors, one after the other (list[r]
     * gets the numel() elements after those of list[0..r-1]). */
    static std::function<void()> scatter_back(const std::vector<at::Tensor> &list, const at::Tensor &flat)
    {
        return [list, flat] {
            int64_t off = 0;
            for (size_t r = 0; r < list.size(); r++) {
                int64_t n = list[r].numel();
                list[r].copy_(flat.narrow(0, off, n).view(list[r].sizes()));
                off += n;
            }
        };
    }

    /* Runs every copy-back of a coalesced operation (none where every tensor was contiguous). */
    static std::function<void()> all_of(std::vector<std::function<void()>> backs)
    {
        return [backs = std::move(backs)] {
            for (const auto &b : backs)
                if (b)
                    b();
        };
    }

    /* Copies a staged result back into the caller's tensor when they differ (non-contiguous). */
    static std::function<void()> copy_back(const at::Tensor &t, const at::Tensor &buf)
    {
        if (t.is_same(buf))
            return nullptr;
        return [t, buf]() mutable { t.copy_(buf); };
    }

    /* Issues n collectives in one colld group; the first failure is returned (the group is always
     * ended). */
    static colld_status_t grouped(size_t n, const std::function<colld_status_t(size_t)> &one)
    {
        colld_status_t st = colld_group_start();
        if (st != COLLD_OK)
            return st;
        for (size_t i = 0; i < n && st == COLLD_OK; i++)
            st = one(i);
        colld_status_t end = colld_group_end();
        return st != COLLD_OK ? st : end;
    }

    /* A new operation with its Work (`source`: a receive's peer); a collective takes the next
     * sequence number. */
    Op make(const char *name, c10d::OpType type, const std::vector<at::Tensor> &outputs, int source = -1)
    {
        if (type != c10d::OpType::SEND && type != c10d::OpType::RECV)
            seq_.fetch_add(1, std::memory_order_relaxed);
        Op o;
        o.name = name;
        o.type = type;
        o.source = source;
        o.work = c10::make_intrusive<WorkColld>(rank_, type, outputs, work_done_, source);
        return o;
    }

    /* The device of an operation's tensors (those the daemon reads or writes): the CPU, or one
     * CUDA device for all of them. */
    static c10::Device device_of(const Op &o)
    {
        c10::Device d(c10::kCPU);
        bool first = true;
        for (const at::Tensor &t : o.keep) {
            if (!t.defined())
                continue;
            TORCH_CHECK(first || t.device() == d, "torch_colld: ", o.name, ": its tensors are on ", d, " and ",
                        t.device(), ": all must be on one device");
            d = t.device();
            first = false;
        }
        return d;
    }

#ifdef COLLD_TORCH_CUDA
    /* Make o stream-ordered when its tensors are on a CUDA device: on the current stream of the
     * caller's thread, with a work whose future belongs to that device. */
    void to_stream(Op &o)
    {
        o.device = device_of(o);
        if (!o.device.is_cuda())
            return;
        o.stream = torch_colld::current_stream(o.device);
        o.work = c10::make_intrusive<WorkColld>(rank_, o.type, o.work->result(), work_done_, o.source, o.device);
    }

    /* Wait (without the GIL) until the worker has issued a CUDA operation; its error text. */
    static std::string wait_issued(const std::shared_ptr<std::promise<std::string>> &issued)
    {
        std::future<std::string> f = issued->get_future();
        if (Py_IsInitialized() && PyGILState_Check()) {
            pybind11::gil_scoped_release nogil;
            return f.get();
        }
        return f.get();
    }

    /* After the worker issued a CUDA operation (or a batch) on the caller's stream: queue the
     * copy-backs of each part on that stream, then complete its work, on the caller's thread. */
    static void finish_on_stream(const std::string &error, std::vector<std::function<void()>> &dones,
                                 std::vector<c10::intrusive_ptr<WorkColld>> &works)
    {
        for (size_t i = 0; i < works.size(); i++) {
            std::string e = error;
            if (e.empty() && dones[i]) {
                try {
                    dones[i]();
                } catch (const std::exception &x) {
                    e = std::string("torch_colld: copying the result back failed: ") + x.what();
                }
            }
            works[i]->issued_on_stream(e);
        }
    }
#endif

    /* Fail an operation that will not run: its work, or every part's of a batch; a CUDA
     * operation's caller, who waits for its issue, completes them. */
    static void fail(Op &o, const std::string &why)
    {
        if (o.issued) {
            o.issued->set_value(std::string("torch_colld: ") + o.name + ": " + why);
            return;
        }
        if (o.work)
            o.work->complete(std::string("torch_colld: ") + o.name + ": " + why);
        for (Op &p : o.parts)
            fail(p, why);
    }

    /* Queue an operation for the worker, or hold it in the batch while coalescing
     * (batch_isend_irecv); returns its Work. */
    c10::intrusive_ptr<c10d::Work> post(Op &&o)
    {
#ifdef COLLD_TORCH_CUDA
        to_stream(o);
        std::vector<std::function<void()>> dones{ o.done };
        std::vector<c10::intrusive_ptr<WorkColld>> works{ o.work };
#else
        TORCH_CHECK(device_of(o).is_cpu(), "torch_colld: ", o.name, ": only CPU tensors are supported");
#endif
        c10::intrusive_ptr<WorkColld> w = o.work;
        std::shared_ptr<std::promise<std::string>> issued;
        bool queued = false, here = false;
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (!stop_ && coalescing_ > 0) {
                batch_.push_back(std::move(o));
                return w;
            }
            if (!stop_) {
                if (o.device.is_cuda()) /* stream-ordered, also on the default stream (NULL) */
                    o.issued = issued = std::make_shared<std::promise<std::string>>();
                else if (queue_.empty() && !busy_ && inline_ok(o))
                    here = busy_ = inline_ = true; /* the worker is idle: this thread has the communicator */
                if (!here) {
                    queue_.push_back(std::move(o));
                    queued_.store(queue_.size(), std::memory_order_release);
                    queued = true;
                }
            }
        }
        if (here) {
            run_inline(o);
            return w;
        }
        if (!queued)
            fail(o, "the process group was shut down (destroy_process_group, abort or interpreter exit)");
        cv_.notify_one();
#ifdef COLLD_TORCH_CUDA
        if (issued)
            finish_on_stream(wait_issued(issued), dones, works);
#endif
        return w;
    }

    /* Whether a host operation may be issued on the caller's thread: small (the bytes the daemon
     * reads and writes at most TORCH_COLLD_INLINE_BYTES), one colld call (not a batch) and not a
     * split. */
    bool inline_ok(const Op &o) const
    {
        if (!inline_bytes_ || !o.may_inline || !o.parts.empty() || !o.issue)
            return false;
        size_t bytes = 0;
        for (const at::Tensor &t : o.keep)
            if (t.defined())
                bytes += nbytes(t);
        return bytes <= inline_bytes_;
    }

    /* A small host operation, posted while the worker had nothing to do, runs on the caller's
     * thread instead of the worker's (saving the two thread hand-offs, caller to worker and back,
     * that a blocking call otherwise pays): this thread issues it (busy_ and inline_ keep the
     * worker off the communicator meanwhile; operations posted by other threads queue behind it),
     * then looks for its completion for as long as recent ones took (Handoff, inline_wait_), and
     * completes its Work here. When it is not done by then (a peer is late), it goes to the front
     * of the worker's queue, issued, and the worker waits for it and completes it as any other:
     * the caller never waits for its peers here, so an async operation stays async and
     * Work.wait(timeout) keeps its meaning. Errors carry colld's detail as on the worker. */
    void run_inline(Op &o)
    {
        colld_status_t st = o.issue(comm_, nullptr);
        Handoff::Wait look{};
        if (st == COLLD_OK) {
            colld_status_t q = COLLD_INPROGRESS;
            look = inline_wait_.spin([&] { return (q = colld_comm_query(comm_)) != COLLD_INPROGRESS; });
            if (q == COLLD_INPROGRESS) {
                std::unique_lock<std::mutex> lock(mu_);
                if (!stop_) { /* to the worker, issued */
                    o.issued_inline = true;
                    o.look = look;
                    queue_.push_front(std::move(o));
                    queued_.store(queue_.size(), std::memory_order_release);
                    busy_ = inline_ = false;
                    lock.unlock();
                    inline_handed_.fetch_add(1, std::memory_order_relaxed);
                    cv_.notify_all();
                    return;
                }
                lock.unlock(); /* stopping: the worker may be gone; wait here (an abort ends it) */
                q = colld_comm_synchronize(comm_);
            }
            inline_wait_.done(look);
            st = q;
        }
        inline_done_.fetch_add(1, std::memory_order_relaxed);
        std::string error = settle(o, st == COLLD_OK ? std::string() : failure(o, st));
        {
            std::lock_guard<std::mutex> lock(mu_);
            busy_ = inline_ = false;
        }
        cv_.notify_all(); /* the worker, for what queued meanwhile; stop_worker, waiting for inline_ */
        o.work->complete(error);
    }

    /* The text of a failed colld call of operation o: colld's detail, and for a point-to-point
     * mismatch how torch_colld maps the torch call onto colld's. */
    std::string failure(const Op &o, colld_status_t st)
    {
        const char *detail = colld_comm_last_error(comm_);
        std::string m = colld_failure(o.name, st, detail);
        const char *hint = o.hint;
        for (const Op &p : o.parts)
            hint = hint ? hint : p.hint;
        if (st == COLLD_ERR_MISMATCH && hint && detail && std::strstr(detail, "point-to-point"))
            m += std::string(" (") + hint + ")";
        return m;
    }

    /* After o's colld calls completed with `error` (empty: they succeeded): check what arrived,
     * copy staged results back, and release the tensors. Returns the operation's error. */
    static std::string settle(Op &o, std::string error)
    {
        if (error.empty() && o.check)
            error = o.check();
        if (error.empty() && o.done) {
            try {
                o.done();
            } catch (const std::exception &e) {
                error = std::string("torch_colld: ") + o.name + ": copying the result back failed: " + e.what();
            }
        }
        o.keep.clear();
        return error;
    }

    /* The worker: issues each queued operation, waits for it with colld_comm_synchronize (which
     * busy-polls only briefly, while a CPU is free and the completion is expected within
     * microseconds, then sleeps; libcolld's client/spin.h) and completes its Work. After stop,
     * what is still queued fails. */
    void run()
    {
        for (;;) {
            Op o;
            auto look = next_op_.spin([this] { return queued_.load(std::memory_order_acquire) != 0; });
            {
                std::unique_lock<std::mutex> lock(mu_);
                /* Not while the caller's thread has the communicator (run_inline). */
                cv_.wait(lock, [this] { return stop_ || (!queue_.empty() && !inline_); });
                if (queue_.empty())
                    return;
                if (inline_) { /* stopping: what is queued behind the caller's operation fails */
                    o = std::move(queue_.back());
                    queue_.pop_back();
                    queued_.store(queue_.size(), std::memory_order_release);
                    lock.unlock();
                    fail(o, "the process group was destroyed before it ran");
                    continue;
                }
                next_op_.done(look);
                o = std::move(queue_.front());
                queue_.pop_front();
                queued_.store(queue_.size(), std::memory_order_release);
                busy_ = !stop_ || o.issued_inline;
                if (stop_ && !o.issued_inline) {
                    lock.unlock();
                    fail(o, "the process group was destroyed before it ran");
                    continue;
                }
            }
#ifdef COLLD_TORCH_CUDA
            /* A CUDA operation is issued on the caller's stream: its device's context current here. */
            c10::Device dev = o.parts.empty() ? o.device : o.parts[0].device;
            std::string no_ctx = dev.is_cuda() ? torch_colld::make_current(dev) : std::string();
            if (!no_ctx.empty() && o.issued) {
                o.issued->set_value("torch_colld: " + std::string(o.name) + ": " + no_ctx);
                std::lock_guard<std::mutex> lock(mu_);
                busy_ = false;
                continue;
            }
#endif
            /* A batch's parts go in one colld group; an operation its caller issued (run_inline)
             * is only waited for. */
            colld_status_t st = o.issued_inline   ? COLLD_OK
                                : o.parts.empty() ? o.issue(comm_, o.stream)
                                                  : grouped(o.parts.size(), [&](size_t i) {
                                                        return o.parts[i].issue(comm_, o.parts[i].stream);
                                                    });
            if (o.issued) { /* stream-ordered: issued, the caller completes it */
                o.issued->set_value(st == COLLD_OK ? std::string() : failure(o, st));
                std::lock_guard<std::mutex> lock(mu_);
                busy_ = false;
                continue;
            }
            if (st == COLLD_OK)
                st = colld_comm_synchronize(comm_);
            if (o.issued_inline)
                inline_wait_.done(o.look); /* how long the caller would have had to look */
            std::string error = st == COLLD_OK ? std::string() : failure(o, st);
            std::vector<std::string> errors;
            if (o.parts.empty())
                errors.push_back(settle(o, error));
            for (Op &p : o.parts)
                errors.push_back(settle(p, error));
            {
                std::lock_guard<std::mutex> lock(mu_);
                busy_ = false;
            }
            if (o.parts.empty())
                o.work->complete(errors[0]);
            for (size_t i = 0; i < o.parts.size(); i++)
                o.parts[i].work->complete(errors[i]);
            if (!o.parts.empty() && o.work) { /* a batch's own Work: done with its last part */
                std::string first;
                for (const std::string &e : errors)
                    if (first.empty())
                        first = e;
                o.work->complete(first);
            }
        }
    }

    std::shared_ptr<colld_client_t> client_; /* shared with the tensors from empty() */
    colld_comm_t *comm_ = nullptr;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Op> queue_;                     /* guarded by mu_ */
    std::atomic<uint64_t> seq_{ 0 };           /* collectives posted (getSequenceNumberForGroup) */
    std::atomic<size_t> queued_{ 0 };          /* queue_.size(), for the worker's look before it blocks */
    Handoff next_op_;                          /* how the worker waits for the next operation */
    std::shared_ptr<Handoff> work_done_ = std::make_shared<Handoff>(); /* how callers wait for their Work */
    bool stop_ = false;                        /* guarded by mu_ */
    bool busy_ = false;                        /* guarded by mu_: the worker, or a caller, runs an operation */
    bool inline_ = false;                      /* guarded by mu_: a caller's thread has the communicator */
    Handoff inline_wait_;                      /* how long run_inline looks for its completion */
    size_t inline_bytes_ = 0; /* run_inline's limit: TORCH_COLLD_INLINE_BYTES (0, the default: off) */
    std::atomic<uint64_t> inline_done_{ 0 };   /* operations run_inline completed on the caller's thread */
    std::atomic<uint64_t> inline_handed_{ 0 }; /* ... and those it issued and handed to the worker */
    int coalescing_ = 0;                       /* guarded by mu_: startCoalescing's not yet ended (nesting) */
    std::vector<Op> batch_;                    /* guarded by mu_: what was posted while coalescing */
    c10::intrusive_ptr<WorkColld> batch_work_; /* guarded by mu_: the Work endCoalescing returns */
    std::chrono::milliseconds timeout_;        /* the communicator's (split's default) */
    std::mutex join_mu_;                       /* one joiner at a time */
    /* guarded by mu_: the store of the last split, and the group it made (none: this rank was in
     * no split); weak, so that neither outlives its users */
    c10::weak_intrusive_ptr<c10d::Store> split_store_{ c10::intrusive_ptr<c10d::Store>() };
    c10::weak_intrusive_ptr<c10d::Backend> split_last_{ c10::intrusive_ptr<c10d::Backend>() };
    std::thread worker_;
    ColldAllocator *allocator_ = nullptr; /* for DDP's buckets (allocateTensor); never freed */
    bool ddp_buckets_ = true;             /* supportsTensorAlloc: TORCH_COLLD_DDP_BUCKETS is not "0" */
};

} // namespace
} // namespace torch_colld

PYBIND11_MODULE(_torch_colld, m)
{
    using torch_colld::ProcessGroupColld;
    m.doc() = "torch.distributed backend over libcolld (import torch_colld, then init_process_group(\"colld\"))";
    /* torch registers c10d::Backend (with its intrusive_ptr holder) in this module. */
    pybind11::module_::import("torch._C._distributed_c10d");
    pybind11::class_<ProcessGroupColld, c10::intrusive_ptr<ProcessGroupColld>, c10d::Backend> cls(m,
                                                                                                  "ProcessGroupColld");
    cls.def(pybind11::init<const c10::intrusive_ptr<c10d::Store> &, int, int, std::chrono::milliseconds>(),
            pybind11::arg("store"), pybind11::arg("rank"), pybind11::arg("size"), pybind11::arg("timeout"),
            pybind11::call_guard<pybind11::gil_scoped_release>());
    /* What split_group reads from its parent's backend (ProcessGroupNCCL has the same). */
    cls.def_property_readonly("options", &ProcessGroupColld::getBackendOptions);
    /* new_group on a default group bound to a device (bound_device_id) calls this on the ranks left
     * out, for backends that make subgroups by splitting (NCCL): torch_colld makes a new_group's
     * communicator through the store, so they have nothing to do. */
    cls.def(
        "perform_nocolor_split", [](ProcessGroupColld &, const c10::Device &) {}, pybind11::arg("device"));
    using Options = ProcessGroupColld::Options;
    pybind11::class_<Options, c10d::Backend::Options, c10::intrusive_ptr<Options>>(cls, "Options")
        .def("__copy__", [](const Options &o) { return c10::make_intrusive<Options>(o); })
        .def(
            "__deepcopy__", [](const Options &o, pybind11::dict) { return c10::make_intrusive<Options>(o); },
            pybind11::arg("memo"));
    /* The dtype travels as a tensor of it (`like`), which needs no caster for at::ScalarType. */
    m.def(
        "_empty",
        [](c10d::Backend &backend, const std::vector<int64_t> &sizes, const at::Tensor &like) {
            auto *colld = dynamic_cast<ProcessGroupColld *>(&backend);
            TORCH_CHECK(colld, "torch_colld.empty: the group's CPU backend is ", backend.getBackendName(),
                        ", not colld");
            return colld->empty(sizes, like.scalar_type());
        },
        pybind11::arg("backend"), pybind11::arg("sizes"), pybind11::arg("like"),
        "A CPU tensor in memory shared with the backend's colld daemon (zero copy in that group's operations)");
    m.def(
        "_push_allocator",
        [](c10d::Backend &backend, size_t min_bytes) {
            auto *colld = dynamic_cast<ProcessGroupColld *>(&backend);
            TORCH_CHECK(colld, "torch_colld.colld_memory: the group's CPU backend is ", backend.getBackendName(),
                        ", not colld");
            torch_colld::push_cpu_allocator(colld->cpu_allocator(min_bytes));
        },
        pybind11::arg("backend"), pybind11::arg("min_bytes"),
        "Put the backend's colld-memory allocator in force for every CPU allocation (process-wide)");
    m.def("_pop_allocator", &torch_colld::pop_cpu_allocator,
          "Put back the CPU allocator _push_allocator replaced; False when none was pushed");
    m.def(
        "_client_stats",
        [](c10d::Backend &backend) {
            auto *colld = dynamic_cast<ProcessGroupColld *>(&backend);
            TORCH_CHECK(colld, "torch_colld.memory_stats: the group's CPU backend is ", backend.getBackendName(),
                        ", not colld");
            colld_client_stats_t st = colld->client_stats();
            pybind11::dict d;
            d["zero_copy"] = st.zero_copy;
            d["staged"] = st.staged;
            d["staged_bytes"] = st.staged_bytes;
            auto in = colld->inline_stats();
            d["inline"] = in.first;
            d["inline_handed_off"] = in.second;
            return d;
        },
        pybind11::arg("backend"));
    m.def("_alloc_stats", [] {
        torch_colld::AllocStats a = torch_colld::ColldAllocator::stats();
        pybind11::dict d;
        d["colld_allocs"] = a.colld_allocs;
        d["colld_bytes"] = a.colld_bytes;
        d["fallbacks"] = a.fallbacks;
        d["small"] = a.small;
        d["max_bytes"] = a.max_bytes;
        d["last_fallback"] = std::string(a.last_reason);
        return d;
    });
    m.def("_stop_all", &ProcessGroupColld::stop_all, pybind11::call_guard<pybind11::gil_scoped_release>(),
          "Stop every process group's worker thread (at interpreter exit; later operations fail)");
    m.attr("colld_api_version") = COLLD_API_VERSION;
#ifdef COLLD_TORCH_CUDA
    m.attr("cuda_built") = true; /* CUDA tensors, stream-ordered (docs/torch.md) */
#else
    m.attr("cuda_built") = false;
#endif
}
