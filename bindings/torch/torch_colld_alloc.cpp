/*
 * torch_colld_alloc.cpp - the CPU allocator backed by colld memory (torch_colld_alloc.h).
 */
#include "torch_colld_alloc.h"

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace torch_colld
{
namespace
{

std::atomic<uint64_t> g_allocs{ 0 }, g_bytes{ 0 }, g_fallbacks{ 0 }, g_small{ 0 };
std::atomic<const char *> g_reason{ "" };

/* TORCH_COLLD_ALLOC_MAX_BYTES: this process's cap on colld memory from the allocators (0, unset or
 * not a number: none of its own; the daemon's limits still hold). Read once. */
uint64_t max_bytes()
{
    static const uint64_t cap = [] {
        const char *v = std::getenv("TORCH_COLLD_ALLOC_MAX_BYTES");
        char *end = nullptr;
        unsigned long long n = v ? std::strtoull(v, &end, 10) : 0;
        return (v && end != v && *end == '\0') ? static_cast<uint64_t>(n) : 0;
    }();
    return cap;
}

/* A block of colld memory: freed with colld_mem_free on its client, which it keeps connected. */
struct Block {
    std::shared_ptr<colld_client_t> client;
    void *ptr;
    size_t bytes;
};

void free_block(void *ctx)
{
    Block *b = static_cast<Block *>(ctx);
    (void)colld_mem_free(b->client.get(), b->ptr); /* unmaps it even when the daemon is gone */
    g_bytes.fetch_sub(b->bytes, std::memory_order_relaxed);
    delete b;
}

c10::DataPtr fall_back(size_t n, const char *why)
{
    g_fallbacks.fetch_add(1, std::memory_order_relaxed);
    g_reason.store(why, std::memory_order_relaxed);
    return c10::GetDefaultCPUAllocator()->allocate(n);
}

std::mutex g_mu;
std::vector<ColldAllocator *> g_allocators; /* every one made, never freed (guarded by g_mu) */
std::vector<c10::Allocator *> g_pushed;     /* what push_cpu_allocator replaced (guarded by g_mu) */

} // namespace

ColldAllocator::ColldAllocator(std::weak_ptr<colld_client_t> client, size_t min_bytes)
    : client_(std::move(client)), min_bytes_(min_bytes)
{
}

ColldAllocator *ColldAllocator::for_client(const std::shared_ptr<colld_client_t> &client, size_t min_bytes)
{
    std::lock_guard<std::mutex> lock(g_mu);
    for (ColldAllocator *a : g_allocators)
        if (a->min_bytes_ == min_bytes && a->client_.lock() == client)
            return a;
    g_allocators.push_back(new ColldAllocator(client, min_bytes));
    return g_allocators.back();
}

c10::DataPtr ColldAllocator::allocate(size_t n)
{
    if (n < min_bytes_ || n == 0) {
        g_small.fetch_add(1, std::memory_order_relaxed);
        return c10::GetDefaultCPUAllocator()->allocate(n);
    }
    std::shared_ptr<colld_client_t> client = client_.lock();
    if (!client)
        return fall_back(n, "its colld client is gone (every process group using it was destroyed)");
    uint64_t cap = max_bytes();
    if (cap && g_bytes.fetch_add(n, std::memory_order_relaxed) + n > cap) {
        g_bytes.fetch_sub(n, std::memory_order_relaxed);
        return fall_back(n, "TORCH_COLLD_ALLOC_MAX_BYTES reached");
    }
    if (!cap)
        g_bytes.fetch_add(n, std::memory_order_relaxed);
    void *p = nullptr;
    colld_status_t st = colld_mem_alloc(client.get(), &p, n, COLLD_MEM_HOST);
    if (st != COLLD_OK) {
        g_bytes.fetch_sub(n, std::memory_order_relaxed);
        /* Static text only: the status names what happened (its detail is colld_last_error's). */
        return fall_back(n, st == COLLD_ERR_QUOTA_EXCEEDED ? "COLLD_ERR_QUOTA_EXCEEDED (a limit of the daemon)"
                            : st == COLLD_ERR_NO_MEMORY    ? "COLLD_ERR_NO_MEMORY"
                            : st == COLLD_ERR_DAEMON_LOST  ? "COLLD_ERR_DAEMON_LOST (the daemon is gone)"
                                                           : "colld_mem_alloc failed");
    }
    g_allocs.fetch_add(1, std::memory_order_relaxed);
    Block *b = new Block{ std::move(client), p, n };
    return c10::DataPtr(p, b, &free_block, c10::Device(c10::kCPU));
}

void ColldAllocator::copy_data(void *dest, const void *src, std::size_t count) const
{
    default_copy_data(dest, src, count);
}

AllocStats ColldAllocator::stats()
{
    return AllocStats{ g_allocs.load(std::memory_order_relaxed),
                       g_bytes.load(std::memory_order_relaxed),
                       g_fallbacks.load(std::memory_order_relaxed),
                       g_small.load(std::memory_order_relaxed),
                       max_bytes(),
                       g_reason.load(std::memory_order_relaxed) };
}

void push_cpu_allocator(c10::Allocator *a)
{
    std::lock_guard<std::mutex> lock(g_mu);
    g_pushed.push_back(c10::GetAllocator(c10::kCPU));
    c10::SetAllocator(c10::kCPU, a, /* priority: above the default's registration */ 1);
}

bool pop_cpu_allocator()
{
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_pushed.empty())
        return false;
    c10::SetAllocator(c10::kCPU, g_pushed.back(), 1);
    g_pushed.pop_back();
    return true;
}

} // namespace torch_colld
