/*
 * torch_colld_work.h - torch_colld's Work (a c10d::Work completed by a process group's worker
 * thread, or, for a CUDA operation, by its caller once issued on its stream) and Op (one queued
 * operation). Internal to torch_colld (torch_colld.cpp, the backend, uses them).
 */
#ifndef COLLD_TORCH_COLLD_WORK_H
#define COLLD_TORCH_COLLD_WORK_H

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <colld/colld.h>

#ifdef COLLD_TORCH_CUDA
#include "torch_colld_cuda.h"
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace torch_colld
{

/* How a thread that hands over to another (the caller waiting for its Work, the worker waiting
 * for the next operation) waits: it looks at `ready`, yielding the CPU between looks, for a
 * window that follows recent hand-offs of the same kind, then blocks. The window doubles (plus
 * 1 us) after a hand-off that came within it and halves after one that did not, at most 200 us;
 * once it is nothing, every 16th wait looks for the whole 200 us so that it can find a window
 * again (a shorter probe never finds a longer one). So a small operation's hand-offs never block
 * (a blocked thread's wake-up costs more than the operation), and a long wait (DDP's next bucket,
 * which comes after a layer's backward pass) blocks at once after a few such waits instead of
 * yielding for its whole length. It yields rather than pausing between looks: the thread it waits
 * for is of the same process, and on a machine with more runnable threads than CPUs (4 ranks of 2
 * threads each on 2 CPUs) a pausing look keeps it off the CPU (libcolld's waits, client/spin.h,
 * pause while a CPU is free: their sub-microsecond fast path needs it; a hand-off here costs
 * microseconds of Python anyway). One per kind of hand-off of a process group; atomics (several
 * callers may wait at once: a lost update only costs one wait its best way). */
class Handoff
{
  public:
    /* Look at `ready` as above. Returns when it holds or the window is over (the caller then
     * blocks), with what done() needs. */
    struct Wait {
        std::chrono::steady_clock::time_point start;
        int64_t window_ns;
    };
    template <typename F> Wait spin(F ready)
    {
        Wait w{ std::chrono::steady_clock::now(), window() };
        if (!w.window_ns)
            return w;
        auto end = w.start + std::chrono::nanoseconds(w.window_ns);
        while (!ready() && std::chrono::steady_clock::now() < end)
            std::this_thread::yield();
        return w;
    }

    /* The hand-off that spin() started is over: learn whether it came within its window. */
    void done(const Wait &w)
    {
        int64_t ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - w.start).count();
        int64_t cur = window_ns_.load(std::memory_order_relaxed);
        if (ns <= std::max(w.window_ns, kMinNs)) { /* within its window, or ready at the first look */
            window_ns_.store(std::min(2 * std::max(cur, ns) + kGrowNs, kMaxNs), std::memory_order_relaxed);
            waits_.store(0, std::memory_order_relaxed);
        } else {
            window_ns_.store(cur / 2, std::memory_order_relaxed);
        }
    }

  private:
    static constexpr int64_t kStartNs = 10000; /* the first window */
    static constexpr int64_t kGrowNs = 1000;   /* added when it doubles */
    static constexpr int64_t kMinNs = 500;     /* a window below this is nothing */
    static constexpr int64_t kMaxNs = 200000;  /* the longest window, and a probe's */

    int64_t window()
    {
        int64_t w = window_ns_.load(std::memory_order_relaxed);
        if (w < kMinNs)
            w = (waits_.fetch_add(1, std::memory_order_relaxed) + 1) % 16 == 0 ? kMaxNs : 0;
        return std::min(w, kMaxNs);
    }

    std::atomic<int64_t> window_ns_{ kStartNs };
    std::atomic<uint32_t> waits_{ 0 };
};

/* One operation's Work. c10d::Work keeps the completion state (wait() raises its exception);
 * the future carries the output tensors, as ProcessGroupGloo's does, for DDP's communication
 * hooks. */
class WorkColld : public c10d::Work
{
  public:
    /* `device`: where the operation's tensors are; a CUDA operation's future is one of that
     * device (it records events on its current stream when completed, as ProcessGroupNCCL's). */
    WorkColld(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, std::shared_ptr<Handoff> handoff,
              int source = -1, c10::Device device = c10::Device(c10::kCPU))
        : c10d::Work(rank, type), outputs_(std::move(outputs)), source_(source), handoff_(std::move(handoff)),
          future_(device.is_cuda()
                      ? c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                                 std::vector<c10::Device>{ device })
                      : c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))),
          device_(device)
    {
    }

#ifdef COLLD_TORCH_CUDA
    /* A stream-ordered (CUDA) operation was issued on the current stream of the caller's thread
     * (empty `error`), or could not be: mark the work done as far as the host is concerned, with
     * an event after the operation on that stream for wait(), isCompleted() and synchronize().
     * Called on the caller's thread, after the copy-backs were queued on the stream. */
    void issued_on_stream(const std::string &error)
    {
        if (!error.empty()) {
            complete(error);
            return;
        }
        fence_ = torch_colld::record_fence(device_);
        complete("");
    }
#endif

    /* Mark the work done: with an empty `error` it succeeded, else wait() and the future raise a
     * RuntimeError with that text. */
    void complete(const std::string &error)
    {
        if (error.empty()) {
            finish();
            future_->markCompleted(c10::IValue(outputs_));
        } else {
            std::exception_ptr e = std::make_exception_ptr(std::runtime_error(error));
            finish(e);
            future_->setError(e);
        }
        done_.store(true, std::memory_order_release);
    }

    /* Wait as c10d's Work does, after looking for the completion as Handoff says (a small
     * operation on a machine with a CPU free completes within it, and a blocked thread's wake-up
     * costs more than the operation itself). */
    bool wait(std::chrono::milliseconds timeout) override
    {
#ifdef COLLD_TORCH_CUDA
        if (fence_) { /* as ProcessGroupNCCL: the current stream waits, the host does not */
            if (exception())
                std::rethrow_exception(exception());
            fence_->block_current();
            return true;
        }
#endif
        auto ready = [this] { return done_.load(std::memory_order_acquire); };
        auto look = handoff_->spin(ready);
        bool ok = c10d::Work::wait(timeout);
        handoff_->done(look);
        return ok;
    }

#ifdef COLLD_TORCH_CUDA
    /* A CUDA operation is complete once the GPU has passed it on its stream. */
    bool isCompleted() override
    {
        return fence_ ? fence_->query() : c10d::Work::isCompleted();
    }

    void synchronize() override
    {
        if (fence_)
            fence_->synchronize();
    }
#endif

    /* The future DDP and get_future() users wait on; its value is the output tensors. */
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override
    {
        return future_;
    }

    /* The output tensors (c10d's Work.result()). */
    std::vector<at::Tensor> result() override
    {
        return outputs_;
    }

    /* A batch's outputs, known at its end: set before the batch is queued. */
    void set_outputs(std::vector<at::Tensor> outputs)
    {
        outputs_ = std::move(outputs);
    }

    /* The rank a receive's data came from (Work._source_rank()); c10d's raises for other work. */
    int sourceRank() const override
    {
        return source_ >= 0 ? source_ : c10d::Work::sourceRank();
    }

  private:
    std::vector<at::Tensor> outputs_;
    int source_; /* a receive's peer, -1 for other operations */
    std::shared_ptr<Handoff> handoff_; /* the group's, for callers waiting for their work */
    c10::intrusive_ptr<c10::ivalue::Future> future_;
    std::atomic<bool> done_{ false }; /* set after the Work and its future are completed */
    c10::Device device_;
#ifdef COLLD_TORCH_CUDA
    std::unique_ptr<torch_colld::StreamFence> fence_; /* a CUDA operation's event, set once issued */
#endif
};

/* One queued operation: `issue` posts its collective(s) on the worker thread; `check` (where
 * set) looks at what arrived once they completed and fails the operation with the text it
 * returns (a received tag that is not the one asked for); `done` copies staged results into the
 * caller's tensors. `keep` holds the tensors the daemon reads or writes alive until then. `hint`
 * is added to a COLLD_ERR_MISMATCH's text: how torch_colld maps the call onto colld's. A batch
 * (batch_isend_irecv) has its own work but no issue: its `parts` are issued in one colld group and
 * each completes its own work.
 *
 * A CUDA operation (`device` a CUDA device) is stream-ordered: `stream` is the current CUDA stream
 * of the caller's thread when it was made, the worker only issues it there (colld returns at
 * once, the stream waits for the daemon) and hands the status to the caller through `issued`;
 * the caller then queues the copy-backs on the same stream and completes the work. */
struct Op {
    const char *name;
    std::function<colld_status_t(colld_comm_t *, void *)> issue; /* (comm, stream) */
    std::function<std::string()> check;
    std::function<void()> done;
    std::vector<at::Tensor> keep;
    c10::intrusive_ptr<WorkColld> work;
    const char *hint = nullptr;
    std::vector<Op> parts;
    c10d::OpType type = c10d::OpType::UNKNOWN;
    int source = -1;
    c10::Device device = c10::Device(c10::kCPU);
    void *stream = nullptr;
    std::shared_ptr<std::promise<std::string>> issued; /* CUDA: the issue's error text, empty if none */
    bool may_inline = true;     /* may be issued on the caller's thread (ProcessGroupColld::run_inline) */
    bool issued_inline = false; /* issued there already: the worker only waits for it and completes it */
    Handoff::Wait look{};       /* issued_inline: the caller's look, which the worker's completion ends */
};

} // namespace torch_colld

#endif
