/*
 * vmm_ipc.c - memory shared between processes in the CUDA driver test double: legacy CUDA IPC
 * (cuIpcGetMemHandle / cuIpcOpenMemHandle / cuIpcCloseMemHandle) and virtual memory management
 * (cuMemCreate, cuMemExportToShareableHandle with POSIX file descriptors, import, reserve, map,
 * set access, unmap, release, granularity, properties).
 *
 * Legacy IPC really crosses processes: the 64-byte handle carries the exporter's pid, its start
 * time (against pid reuse), the number of the memfd that holds the allocation in the exporter,
 * the allocation's buffer id and size and the device UUID. The opener duplicates that descriptor
 * with pidfd_open + pidfd_getfd (the opener needs ptrace rights over the exporter: the same user
 * or CAP_SYS_PTRACE, as CI's root) and checks by the memfd's name that it is still that
 * allocation. Opening a handle in the process that exported it fails with
 * CUDA_ERROR_INVALID_CONTEXT, as with the driver; opening the same handle twice gives the same
 * address, closed once per open.
 *
 * VMM allocations are memfds named after their device's UUID and handle types, so that an fd
 * exported to another process is enough to import it there. A mapping is inaccessible (PROT_NONE
 * for the host, no device bit) until cuMemSetAccess grants access; sizes and addresses must be
 * multiples of the device's granularity; cuMemUnmap takes whole mappings only, and synchronizes.
 */
#include "tests/cudafake/fake.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FK_IPC_MAGIC 0x43464950u /* "PIFC" */
#define VMM_PREFIX "cudafake-vmm:"

/* The legacy IPC handle's bytes. */
typedef struct {
    uint32_t magic;
    uint32_t version;
    int32_t pid;
    int32_t fd;
    uint64_t buffer_id;
    uint64_t bytes;
    uint64_t start_time;
    uint8_t uuid[16];
} ipc_wire_t;
_Static_assert(sizeof(ipc_wire_t) <= sizeof(CUipcMemHandle), "the IPC handle holds the wire struct");

/* Field 22 of /proc/<pid>/stat: when the process started (clock ticks since boot); 0 if unknown. */
static uint64_t start_time(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    int field = 2;
    for (; p && *p && field < 22; p++)
        if (*p == ' ')
            field++;
    return p ? strtoull(p, NULL, 10) : 0;
}

/* The memfd name behind one of our descriptors ("cudafake-...", without "/memfd:" and
 * " (deleted)"), or "" */
static void fd_name(int fd, char *out, size_t len)
{
    char path[64], link[256];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof(link) - 1);
    out[0] = '\0';
    if (n <= 0)
        return;
    link[n] = '\0';
    const char *p = strncmp(link, "/memfd:", 7) == 0 ? link + 7 : "";
    snprintf(out, len, "%s", p);
    char *del = strstr(out, " (deleted)");
    if (del)
        *del = '\0';
}

/* ============================================================================================
 * Legacy IPC
 * ========================================================================================== */

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    FK_BEGIN(cuIpcGetMemHandle);
    if (!pHandle)
        return CUDA_ERROR_INVALID_VALUE;
    fk_ctx_t *ctx;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_ctx_get(&ctx);
    const fk_region_t *reg = fk_region_find((uintptr_t)dptr);
    if (r == CUDA_SUCCESS && (!reg || reg->kind != FK_R_ALLOC || (uintptr_t)dptr >= reg->base + reg->bytes))
        r = CUDA_ERROR_INVALID_VALUE; /* not cuMemAlloc memory (VMM memory has no legacy handle) */
    else if (r == CUDA_SUCCESS && !fk_dev(reg->dev)->ipc)
        r = CUDA_ERROR_NOT_SUPPORTED;
    if (r == CUDA_SUCCESS) {
        ipc_wire_t w = { .magic = FK_IPC_MAGIC, .version = 1, .pid = (int32_t)getpid(), .fd = reg->fd,
                         .buffer_id = reg->buffer_id, .bytes = reg->bytes, .start_time = start_time(getpid()) };
        memcpy(w.uuid, fk_dev(reg->dev)->uuid.bytes, 16);
        memset(pHandle, 0, sizeof(*pHandle));
        memcpy(pHandle->reserved, &w, sizeof(w));
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* Duplicate the exporter's memfd of the allocation in w; -1 with *r set when that fails. */
static int ipc_fetch(const ipc_wire_t *w, CUresult *r)
{
    int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)w->pid, 0);
    if (pidfd < 0) {
        *r = CUDA_ERROR_INVALID_HANDLE; /* the exporter is gone: so is its memory */
        return -1;
    }
    int fd = (int)syscall(SYS_pidfd_getfd, pidfd, w->fd, 0);
    int err = errno;
    close(pidfd);
    if (fd < 0) {
        if (err == EPERM)
            fk_log("cuIpcOpenMemHandle: no ptrace rights over the exporting process %d (pidfd_getfd: %s): run "
                   "both as the same user or give the opener CAP_SYS_PTRACE", (int)w->pid, strerror(err));
        *r = err == EPERM ? CUDA_ERROR_NOT_PERMITTED : CUDA_ERROR_INVALID_HANDLE;
        return -1;
    }
    char want[64], got[256];
    snprintf(want, sizeof(want), "cudafake-alloc:%d:%llu", (int)w->pid, (unsigned long long)w->buffer_id);
    fd_name(fd, got, sizeof(got));
    if (strcmp(want, got) != 0 || (w->start_time && start_time(w->pid) != w->start_time)) {
        close(fd); /* freed in the exporter (its descriptor number reused), or another process */
        *r = CUDA_ERROR_INVALID_HANDLE;
        return -1;
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    return fd;
}

CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    FK_BEGIN(cuIpcOpenMemHandle);
    if (!pdptr || (Flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
        return CUDA_ERROR_INVALID_VALUE;
    ipc_wire_t w;
    memcpy(&w, handle.reserved, sizeof(w));
    fk_ctx_t *ctx;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_ctx_get(&ctx);
    int dev = fk_dev_by_uuid(w.uuid);
    if (r == CUDA_SUCCESS && (w.magic != FK_IPC_MAGIC || w.version != 1 || w.bytes == 0 || w.fd < 0))
        r = CUDA_ERROR_INVALID_VALUE;
    else if (r == CUDA_SUCCESS && w.pid == (int32_t)getpid())
        r = CUDA_ERROR_INVALID_CONTEXT; /* as the driver: never in the exporting process */
    else if (r == CUDA_SUCCESS && dev < 0)
        r = CUDA_ERROR_INVALID_DEVICE;
    /* The same allocation opened before in this process: the same mapping, one more reference. */
    for (fk_region_t *reg = fk_regions(); reg && r == CUDA_SUCCESS; reg = reg->next)
        if (reg->kind == FK_R_IPC && reg->ipc_pid == (pid_t)w.pid && reg->ipc_buffer_id == w.buffer_id) {
            reg->ipc_refs++;
            *pdptr = (CUdeviceptr)reg->base;
            pthread_mutex_unlock(&fk.mu);
            return CUDA_SUCCESS;
        }
    int fd = r == CUDA_SUCCESS ? ipc_fetch(&w, &r) : -1;
    struct stat st;
    fk_region_t *reg = NULL;
    if (fd >= 0 && (fstat(fd, &st) < 0 || (uint64_t)st.st_size < w.bytes))
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (fd >= 0 && !(reg = fk_region_new(FK_R_IPC, (size_t)w.bytes, 4096)))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (reg && mmap((void *)reg->base, reg->size, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_SHARED, fd, 0) == MAP_FAILED) {
        fk_log("cuIpcOpenMemHandle: mmap: %s", strerror(errno));
        fk_region_free(reg);
        reg = NULL;
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (fd >= 0)
        close(fd); /* the mapping holds the memory */
    if (reg) {
        reg->bytes = (size_t)w.bytes;
        reg->dev = dev;
        reg->ctx = ctx;
        reg->buffer_id = ++fk.next_buffer_id;
        reg->ipc_pid = (pid_t)w.pid;
        reg->ipc_buffer_id = w.buffer_id;
        reg->ipc_flags = Flags;
        reg->ipc_refs = 1;
        *pdptr = (CUdeviceptr)reg->base;
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    return cuIpcOpenMemHandle_v2(pdptr, handle, Flags);
}

/* Unmapping synchronizes: the work enqueued before may still use the mapping. */
CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    FK_BEGIN(cuIpcCloseMemHandle);
    fk_ctx_t *ctx;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_ctx_get(&ctx);
    fk_region_t *reg = fk_region_find((uintptr_t)dptr);
    if (r == CUDA_SUCCESS && (!reg || reg->kind != FK_R_IPC || reg->base != (uintptr_t)dptr))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && --reg->ipc_refs == 0) {
        fk_sync_all("cuIpcCloseMemHandle");
        reg = fk_region_find((uintptr_t)dptr);
        if (reg && reg->kind == FK_R_IPC && reg->ipc_refs == 0)
            fk_region_free(reg);
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* Close the IPC mappings opened in a context that is going away (lock held). */
void fk_ipc_ctx_destroyed(fk_ctx_t *ctx)
{
    for (fk_region_t *r = fk_regions(), *next; r; r = next) {
        next = r->next;
        if (r->kind == FK_R_IPC && r->ctx == ctx)
            fk_region_free(r);
    }
}

/* ============================================================================================
 * VMM: physical allocations
 * ========================================================================================== */

static fk_phys_t *phys_of(CUmemGenericAllocationHandle h)
{
    fk_phys_t *p = (fk_phys_t *)(uintptr_t)h;
    return fk_handle_ok(p, FK_K_PHYS) ? p : NULL;
}

/* Free a physical allocation nothing refers to any more (lock held). */
static void phys_maybe_free(fk_phys_t *p)
{
    if (p->handle_refs > 0 || p->map_refs > 0)
        return;
    fk_handle_del(p);
    if (!p->imported) /* made here: this device's memory */
        fk_dev_mem_give(p->dev, p->size);
    close(p->fd);
    free(p);
}

/* Check an allocation's properties; the device is *dev. */
static CUresult check_prop(const CUmemAllocationProp *prop, int *dev)
{
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fk_dev(prop->location.id))
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = prop->location.id;
    if (!fk_dev(*dev)->vmm)
        return CUDA_ERROR_NOT_SUPPORTED;
    unsigned types = (unsigned)prop->requestedHandleTypes;
    if (types & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED; /* fabric and Windows handles */
    if ((types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) && !fk_dev(*dev)->posix_fd)
        return CUDA_ERROR_NOT_SUPPORTED;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags option)
{
    FK_BEGIN(cuMemGetAllocationGranularity);
    int dev;
    if (!granularity)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_prop(prop, &dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (option == CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        *granularity = fk_dev(dev)->gran_min;
    else if (option == CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        *granularity = fk_dev(dev)->gran_rec;
    else
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                             unsigned long long flags)
{
    FK_BEGIN(cuMemCreate);
    int dev;
    if (!handle || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_prop(prop, &dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (size == 0 || size % fk_dev(dev)->gran_min)
        return CUDA_ERROR_INVALID_VALUE;
    char name[80];
    int n = snprintf(name, sizeof(name), VMM_PREFIX);
    for (int i = 0; i < 16; i++)
        n += snprintf(name + n, sizeof(name) - (size_t)n, "%02x", (unsigned char)fk_dev(dev)->uuid.bytes[i]);
    snprintf(name + n, sizeof(name) - (size_t)n, ":%u", (unsigned)prop->requestedHandleTypes);
    pthread_mutex_lock(&fk.mu);
    fk_phys_t *p = NULL;
    if (!fk_dev_mem_take(dev, size)) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (!(p = calloc(1, sizeof(*p))) || (p->fd = fk_memfd(name, size)) < 0) {
        free(p);
        p = NULL;
        fk_dev_mem_give(dev, size);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (p) {
        p->size = size;
        p->dev = dev;
        p->prop = *prop;
        p->block_id = ++fk.next_buffer_id;
        p->handle_refs = 1;
        fk_handle_add(p, FK_K_PHYS);
        *handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* The memory goes once no mapping uses it either. */
CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
    FK_BEGIN(cuMemRelease);
    pthread_mutex_lock(&fk.mu);
    fk_phys_t *p = phys_of(handle);
    CUresult r = p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (p && --p->handle_refs == 0) {
        fk_handle_del(p);
        if (p->map_refs == 0)
            phys_maybe_free(p);
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType handleType, unsigned long long flags)
{
    FK_BEGIN(cuMemExportToShareableHandle);
    if (!shareableHandle || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    fk_phys_t *p = phys_of(handle);
    CUresult r = CUDA_SUCCESS;
    if (!p || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
        !(p->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        int fd = fcntl(p->fd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0)
            r = CUDA_ERROR_OUT_OF_MEMORY;
        else
            *(int *)shareableHandle = fd;
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* The caller keeps its descriptor (and closes it); the allocation gets a handle of its own. */
CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                                CUmemAllocationHandleType shHandleType)
{
    FK_BEGIN(cuMemImportFromShareableHandle);
    if (!handle || shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    int in = (int)(intptr_t)osHandle;
    char name[256], uuid_hex[40];
    unsigned types = 0;
    fd_name(in, name, sizeof(name));
    struct stat st;
    if (strncmp(name, VMM_PREFIX, strlen(VMM_PREFIX)) != 0 ||
        sscanf(name + strlen(VMM_PREFIX), "%32[0-9a-f]:%u", uuid_hex, &types) != 2 || strlen(uuid_hex) != 32 ||
        fstat(in, &st) < 0 || st.st_size <= 0)
        return CUDA_ERROR_INVALID_VALUE; /* not a VMM allocation's descriptor */
    unsigned char uuid[16];
    for (int i = 0; i < 16; i++) {
        unsigned b;
        sscanf(uuid_hex + 2 * i, "%2x", &b);
        uuid[i] = (unsigned char)b;
    }
    pthread_mutex_lock(&fk.mu);
    int dev = fk_dev_by_uuid(uuid);
    fk_phys_t *p = NULL;
    CUresult r = CUDA_SUCCESS;
    if (dev < 0)
        r = CUDA_ERROR_INVALID_DEVICE; /* its GPU is not visible here */
    else if (!(p = calloc(1, sizeof(*p))) || (p->fd = fcntl(in, F_DUPFD_CLOEXEC, 0)) < 0) {
        free(p);
        p = NULL;
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (p) {
        p->size = (size_t)st.st_size;
        p->dev = dev;
        p->prop = (CUmemAllocationProp){ .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                         .requestedHandleTypes = (CUmemAllocationHandleType)types,
                                         .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev } };
        p->block_id = ++fk.next_buffer_id;
        p->imported = true; /* its memory is counted in the exporter */
        p->handle_refs = 1;
        fk_handle_add(p, FK_K_PHYS);
        *handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle)
{
    FK_BEGIN(cuMemGetAllocationPropertiesFromHandle);
    if (!prop)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    fk_phys_t *p = phys_of(handle);
    if (p)
        *prop = p->prop;
    pthread_mutex_unlock(&fk.mu);
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    FK_BEGIN(cuMemRetainAllocationHandle);
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    const fk_region_t *reg = fk_region_find((uintptr_t)addr);
    const fk_map_t *m = reg && reg->kind == FK_R_RESERVE ? fk_map_find(reg, (uintptr_t)addr) : NULL;
    if (m) {
        if (m->phys->handle_refs++ == 0)
            fk_handle_add(m->phys, FK_K_PHYS);
        *handle = (CUmemGenericAllocationHandle)(uintptr_t)m->phys;
    }
    pthread_mutex_unlock(&fk.mu);
    return m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ============================================================================================
 * VMM: address space, mappings, access
 * ========================================================================================== */

/* The smallest granularity of any device: what a reservation's size must be a multiple of. */
static size_t reserve_granularity(void)
{
    size_t g = 0;
    for (int i = 0; i < fk.cfg.ndev; i++)
        if (!g || fk.cfg.dev[i].gran_min < g)
            g = fk.cfg.dev[i].gran_min;
    return g ? g : 4096;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                     unsigned long long flags)
{
    FK_BEGIN(cuMemAddressReserve);
    (void)addr; /* a hint, which the double does not follow */
    size_t g = reserve_granularity();
    if (!ptr || flags != 0 || size == 0 || size % g || (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    fk_region_t *reg = fk_region_new(FK_R_RESERVE, size, alignment > g ? alignment : g);
    if (reg)
        *ptr = (CUdeviceptr)reg->base;
    pthread_mutex_unlock(&fk.mu);
    return reg ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    FK_BEGIN(cuMemAddressFree);
    pthread_mutex_lock(&fk.mu);
    fk_region_t *reg = fk_region_find((uintptr_t)ptr);
    CUresult r = CUDA_SUCCESS;
    if (!reg || reg->kind != FK_R_RESERVE || reg->base != (uintptr_t)ptr || reg->size != size)
        r = CUDA_ERROR_INVALID_VALUE;
    else if (reg->maps)
        r = CUDA_ERROR_INVALID_VALUE; /* still mapped: cuMemUnmap first */
    else
        fk_region_free(reg);
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags)
{
    FK_BEGIN(cuMemMap);
    if (flags != 0 || offset != 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t a = (uintptr_t)ptr;
    pthread_mutex_lock(&fk.mu);
    fk_phys_t *p = phys_of(handle);
    fk_region_t *reg = fk_region_find(a);
    CUresult r = CUDA_SUCCESS;
    fk_map_t *m = NULL;
    if (!p)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (!reg || reg->kind != FK_R_RESERVE || a + size < a || a + size > reg->base + reg->size ||
             a % fk_dev(p->dev)->gran_min || size % fk_dev(p->dev)->gran_min || size > p->size)
        r = CUDA_ERROR_INVALID_VALUE;
    for (const fk_map_t *o = reg && r == CUDA_SUCCESS ? reg->maps : NULL; o; o = o->next)
        if (a < o->base + o->size && o->base < a + size)
            r = CUDA_ERROR_INVALID_VALUE; /* already mapped */
    if (r == CUDA_SUCCESS && !(m = calloc(1, sizeof(*m))))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (m && mmap((void *)a, size, PROT_NONE, MAP_FIXED | MAP_SHARED, p->fd, 0) == MAP_FAILED) {
        fk_log("cuMemMap: mmap: %s", strerror(errno));
        free(m);
        m = NULL;
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (m) {
        *m = (fk_map_t){ .base = a, .size = size, .phys = p, .buffer_id = ++fk.next_buffer_id };
        fk_map_t **pp = &reg->maps;
        while (*pp && (*pp)->base < a)
            pp = &(*pp)->next;
        m->next = *pp;
        *pp = m;
        p->map_refs++;
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* The mappings of [a, a + size) if it is made of whole mappings of one reservation (lock held). */
static fk_region_t *whole_mappings(uintptr_t a, size_t size)
{
    fk_region_t *reg = fk_region_find(a);
    if (!reg || reg->kind != FK_R_RESERVE || size == 0 || a + size < a || a + size > reg->base + reg->size)
        return NULL;
    uintptr_t at = a;
    for (const fk_map_t *m = reg->maps; m && at < a + size; m = m->next) {
        if (m->base + m->size <= at)
            continue;
        if (m->base != at || m->base + m->size > a + size)
            return NULL;
        at = m->base + m->size;
    }
    return at == a + size ? reg : NULL;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    FK_BEGIN(cuMemUnmap);
    uintptr_t a = (uintptr_t)ptr;
    pthread_mutex_lock(&fk.mu);
    CUresult r = whole_mappings(a, size) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        fk_sync_all("cuMemUnmap");
    fk_region_t *reg = r == CUDA_SUCCESS ? whole_mappings(a, size) : NULL; /* the lock was dropped */
    if (r == CUDA_SUCCESS && !reg)
        r = CUDA_ERROR_INVALID_VALUE;
    for (fk_map_t **pp = reg ? &reg->maps : NULL; pp && *pp;) {
        fk_map_t *m = *pp;
        if (m->base < a || m->base >= a + size) {
            pp = &m->next;
            continue;
        }
        *pp = m->next;
        fk_arena_give(m->base, m->size);
        m->phys->map_refs--;
        phys_maybe_free(m->phys);
        free(m);
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    FK_BEGIN(cuMemSetAccess);
    uintptr_t a = (uintptr_t)ptr;
    if (!desc || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    fk_region_t *reg = whole_mappings(a, size);
    CUresult r = reg ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count && r == CUDA_SUCCESS; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
            (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
             desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
            r = CUDA_ERROR_INVALID_VALUE;
        else if (!fk_dev(desc[i].location.id))
            r = CUDA_ERROR_INVALID_DEVICE;
        for (const fk_map_t *m = reg->maps; m && r == CUDA_SUCCESS; m = m->next)
            if (m->base >= a && m->base < a + size && desc[i].location.id != m->phys->dev &&
                !fk_dev_peer_capable(desc[i].location.id, m->phys->dev))
                r = CUDA_ERROR_INVALID_DEVICE; /* no peer path from that device to the memory */
    }
    for (fk_map_t *m = r == CUDA_SUCCESS ? reg->maps : NULL; m; m = m->next) {
        if (m->base < a || m->base >= a + size)
            continue;
        for (size_t i = 0; i < count; i++) {
            uint32_t bit = 1u << desc[i].location.id;
            m->read = desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE ? m->read | bit : m->read & ~bit;
            m->write = desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? m->write | bit : m->write & ~bit;
        }
        /* The host side (where the host builds of kernels run) sees it while any device may. */
        int prot = m->write ? PROT_READ | PROT_WRITE : m->read ? PROT_READ : PROT_NONE;
        if (mprotect((void *)m->base, m->size, prot) < 0)
            fk_log("cuMemSetAccess: mprotect: %s", strerror(errno));
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr)
{
    FK_BEGIN(cuMemGetAccess);
    if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fk_dev(location->id))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&fk.mu);
    const fk_region_t *reg = fk_region_find((uintptr_t)ptr);
    const fk_map_t *m = reg && reg->kind == FK_R_RESERVE ? fk_map_find(reg, (uintptr_t)ptr) : NULL;
    if (m) {
        uint32_t bit = 1u << location->id;
        *flags = (m->write & bit)  ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                 : (m->read & bit) ? CU_MEM_ACCESS_FLAGS_PROT_READ
                                   : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    }
    pthread_mutex_unlock(&fk.mu);
    return m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
