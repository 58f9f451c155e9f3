/*
 * torch_colld_alloc.h - a CPU c10::Allocator backed by colld memory: what DDP's gradient buckets
 * are made of (the backend's allocateTensor, which torch's DDP reducer calls for each bucket), and
 * what torch_colld.colld_memory() puts in force for every CPU tensor torch allocates meanwhile.
 * Tensors in colld memory are zero copy in the operations of the client's groups, where any
 * other memory is staged by libcolld. Internal to torch_colld.
 *
 * Bounded: an allocation that colld memory cannot hold (the daemon's per-process and per-tenant
 * limits, COLLD_ERR_QUOTA_EXCEEDED; the daemon gone; this process's own cap,
 * TORCH_COLLD_ALLOC_MAX_BYTES) comes from torch's default CPU allocator instead, and is counted:
 * the user's allocation never fails for it. Each block holds its colld client, so a tensor that
 * outlives its process group (or the daemon) is freed correctly: colld_mem_free on the still
 * connected client, which disconnects with its last block.
 */
#ifndef COLLD_TORCH_COLLD_ALLOC_H
#define COLLD_TORCH_COLLD_ALLOC_H

#include <c10/core/Allocator.h>

#include <colld/colld.h>

#include <cstdint>
#include <memory>

namespace torch_colld
{

/* What the colld allocators of this process did since it started (every client's together). */
struct AllocStats {
    uint64_t colld_allocs;   /* blocks allocated in colld memory */
    uint64_t colld_bytes;    /* bytes of those blocks still allocated */
    uint64_t fallbacks;      /* allocations colld memory could not serve (torch's allocator did) */
    uint64_t small;          /* allocations below the size worth colld memory (torch's allocator did) */
    uint64_t max_bytes;      /* this process's cap (TORCH_COLLD_ALLOC_MAX_BYTES; 0: the daemon's only) */
    const char *last_reason; /* why the last fallback happened (static storage; "" if none) */
};

/* One colld client's allocator. A storage keeps a raw pointer to the allocator that made it (to
 * resize it), so allocators are never destroyed: make them with for_client(), which keeps every
 * one for the life of the process (a few bytes each). An allocator holds its client weakly: once
 * the client is gone (its groups and blocks are), it serves torch's allocator's memory. */
class ColldAllocator final : public c10::Allocator
{
  public:
    /* An allocator for `client`. Allocations below `min_bytes` come from torch's allocator (a
     * registration per small tensor would cost more than it saves: the fast path copies such
     * sizes anyway). */
    static ColldAllocator *for_client(const std::shared_ptr<colld_client_t> &client, size_t min_bytes);

    c10::DataPtr allocate(size_t n) override;
    void copy_data(void *dest, const void *src, std::size_t count) const override;

    static AllocStats stats();

  private:
    ColldAllocator(std::weak_ptr<colld_client_t> client, size_t min_bytes);
    std::weak_ptr<colld_client_t> client_;
    size_t min_bytes_;
};

/* Put `a` in force as torch's CPU allocator (push), or put back the one in force before the
 * matching push (pop; false when there was none). Nests. Process-wide: c10 has one CPU allocator
 * for every thread. */
void push_cpu_allocator(c10::Allocator *a);
bool pop_cpu_allocator();

} // namespace torch_colld

#endif
