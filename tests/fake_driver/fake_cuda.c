/* A fake libcuda.so.1 for the shim's tests: N devices of M MiB, contexts current per thread,
 * streams, pools with a reserve, VMM handles, arrays, the legacy 32-bit ABI, and a call counter
 * per entry point (fake_calls("cuMemAlloc_v2")). Build with -Wl,-Bsymbolic so addresses handed
 * out are the fake's own.
 *
 * Env knobs:
 *   FAKE_CUDA_DEVICES=N       devices (default 2, at most 16)
 *   FAKE_CUDA_MEM_MB=M        memory per device (default 1024)
 *   FAKE_CUDA_ORDER=1,0       CUDA ordinal i is physical device order[i] (like CUDA_VISIBLE_DEVICES);
 *                             the device count becomes the list length; unset: CUDA_VISIBLE_DEVICES as
 *                             the real driver reads it (indices, UUIDs, UUID prefixes: visible.h) over the
 *                             FAKE_CUDA_DEVICES physical devices; neither: identity
 *   FAKE_CUDA_CTX_MB=M        memory a context takes (the retained primary context once per
 *                             device, every created/green context; default 0)
 *   FAKE_CUDA_POOL_GRANULE_MB=G a pool's reserve grows in steps of G MiB, as a real pool's does
 *                             (default: by the shortfall exactly)
 *   FAKE_CUDA_POOL_SPARE_UNUSABLE=1 a pool's spare serves no allocation: each grows the reserve by its
 *                             whole size, as a real pool does when its spare is in pieces too small or
 *                             freed on another stream and not reusable yet
 *   FAKE_CUDA_ALLOC_DELAY_MS=N cuMemAlloc and pool allocations take N ms before they take the memory
 *                             (a call still running)
 *   FAKE_CUDA_FREE_DELAY_MS=N cuMemFree gives the memory back, then takes N ms before it returns
 *   FAKE_CUDA_STREAM_MB=M     the driver's state for streams: the 2nd, 6th, 10th, ... stream made in a process
 *                             takes M MiB of device memory more, kept until the process exits (an H200
 *                             takes 2 MiB for every four streams, kept when they are destroyed)
 *   FAKE_CUDA_MANAGED_UNTOUCHED=1 managed memory takes no device memory (resident only once touched,
 *                             and nothing here touches it: NVML does not show it)
 *   FAKE_CUDA_EXIT_DELAY_MS=N the process takes N ms more to exit, after the shim's destructor has run
 *                             (the driver's own teardown), its other threads still running
 *   FAKE_CUDA_LEGACY=1        the CUDA 12.8+/13 queries (cuStreamGetDevice, cuCtxGetDevice_v2, pool
 *                             location attributes) fail, like an older driver
 *   FAKE_CUDA_PROC_ALIASES=1  cuGetProcAddress hands out internal addresses for some entries
 *   FAKE_CUDA_SHARED=FILE     the devices are shared by every process naming FILE, as a real GPU is:
 *                             each process counts its use in a row of FILE, which counts for nothing
 *                             once the process is dead (the driver frees a dead process's memory);
 *                             fake_used_all(dev) sums the rows (a container's physical use)
 * Test hooks: fake_calls, fake_reset_calls, fake_used, fake_used_high (this process's highest use, never
 * reset: what a moment of over-use leaves), fake_used_physical, fake_used_all, fake_ctx_bytes,
 * fake_has_ctx, fake_last_args, fake_grow (the driver takes memory for the process outside any call the
 * shim sees: a module loaded lazily, local memory grown at a launch). */
#define _GNU_SOURCE /* F_OFD_* */
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include "sm.h"      /* the SMs: their count, what one holds */
#include "visible.h" /* CUDA_VISIBLE_DEVICES */
/* cuda.h maps these names onto their newest versions; the fake exports the legacy ABIs under the
 * plain names, as the real driver does */
#undef cuGetProcAddress
#undef cuMemAlloc
#undef cuMemFree
#undef cuMemAllocPitch
#undef cuMemGetInfo
#undef cuDeviceTotalMem
#undef cuArrayCreate
#undef cuArray3DCreate
#undef cuCtxCreate
#undef cuCtxDestroy
#undef cuDeviceGetUuid

/* the legacy 32-bit ABI: cuda.h only declares it for the driver's own build */
typedef unsigned int CUdeviceptr_v1;
typedef struct CUDA_ARRAY_DESCRIPTOR_v1_st {
    unsigned int Width;
    unsigned int Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;
typedef struct CUDA_ARRAY3D_DESCRIPTOR_v1_st {
    unsigned int Width;
    unsigned int Height;
    unsigned int Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;
CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize);
CUresult cuMemFree(CUdeviceptr_v1 dptr);
CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int w, unsigned int h, unsigned int esz);
CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total_b);
CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev);
CUresult cuArrayCreate(CUarray *a, const CUDA_ARRAY_DESCRIPTOR_v1 *d);
CUresult cuArray3DCreate(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d);
CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy(CUcontext ctx);
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);

#define EXPORT __attribute__((visibility("default")))
#define MAXDEV 16
#define MAGIC_MEM 0x6d656d21u
#define MAGIC_CTX 0x63747821u
#define MAGIC_STREAM 0x73747221u
#define MAGIC_POOL 0x706f6f6cu
#define MAGIC_DEAD 0x64656164u

/* ---- call counters ---- */
#define COUNTED(X) \
    X(cuInit) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDriverGetVersion) X(cuDevicePrimaryCtxRetain) \
    X(cuDevicePrimaryCtxRelease_v2) X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxGetDevice_v2) \
    X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent_v2) X(cuStreamCreate) X(cuStreamCreateWithPriority) X(cuStreamDestroy_v2) X(cuStreamGetCtx) \
    X(cuStreamGetDevice) X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemAllocPitch_v2) X(cuMemAllocManaged) \
    X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz) X(cuMemAllocFromPoolAsync) X(cuMemAllocFromPoolAsync_ptsz) \
    X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz) X(cuMemCreate) X(cuMemRelease) X(cuMemPoolCreate) \
    X(cuMemPoolDestroy) X(cuMemPoolGetAttribute) X(cuDeviceGetDefaultMemPool) X(cuDeviceGetMemPool) \
    X(cuArrayCreate_v2) X(cuArray3DCreate_v2) X(cuArrayDestroy) X(cuMipmappedArrayCreate) \
    X(cuMipmappedArrayDestroy) X(cuMemGetInfo_v2) X(cuDeviceTotalMem_v2) X(cuLaunchKernel) \
    X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx) X(cuLaunchKernelEx_ptsz) X(cuLaunchCooperativeKernel) \
    X(cuLaunchCooperativeKernel_ptsz) X(cuGraphLaunch) X(cuGraphLaunch_ptsz) X(cuGetProcAddress) \
    X(cuGetProcAddress_v2) X(cuMemcpyHtoD_v2) \
    X(cuMemAlloc) X(cuMemFree) X(cuMemAllocPitch) X(cuMemGetInfo) X(cuDeviceTotalMem) X(cuArrayCreate) \
    X(cuArray3DCreate) X(cuCtxCreate) X(cuCtxCreate_v2) X(cuCtxCreate_v3) X(cuCtxCreate_v4) X(cuCtxDestroy) \
    X(cuCtxDestroy_v2) X(cuGreenCtxCreate) X(cuGreenCtxDestroy) X(cuCtxFromGreenCtx) \
    X(cuDevicePrimaryCtxReset_v2) X(cuDeviceGetUuid) X(cuDeviceGetUuid_v2) X(cuDeviceSetMemPool) \
    X(cuMemPoolSetAttribute) X(cuMemPoolTrimTo) X(cuStreamSynchronize) X(cuStreamSynchronize_ptsz) \
    X(cuCtxSynchronize) X(cuEventSynchronize)

enum {
#define X(n) C_##n,
    COUNTED(X)
#undef X
    NCOUNTED
};
static const char *const counted_name[] = {
#define X(n) #n,
    COUNTED(X)
#undef X
};
static unsigned long counts[NCOUNTED];
#define COUNT(n) __atomic_fetch_add(&counts[C_##n], 1, __ATOMIC_RELAXED)

EXPORT unsigned long fake_calls(const char *name)
{
    for (int i = 0; i < NCOUNTED; i++)
        if (strcmp(counted_name[i], name) == 0)
            return __atomic_load_n(&counts[i], __ATOMIC_RELAXED);
    return (unsigned long)-1;
}

EXPORT void fake_reset_calls(void)
{
    memset(counts, 0, sizeof counts);
}

/* ---- devices ---- */
static int ndev = 2;
static int phys[MAXDEV]; /* CUDA ordinal -> physical index (FAKE_CUDA_ORDER) */
static uint64_t dev_total = 1024ull << 20;
static uint64_t own_used[MAXDEV];
static uint64_t *dev_used = own_used; /* per CUDA ordinal: allocations + contexts + pool reserves */
static uint64_t ctx_size;         /* FAKE_CUDA_CTX_MB */
static uint64_t pool_granule;     /* FAKE_CUDA_POOL_GRANULE_MB */
static int spare_unusable;        /* FAKE_CUDA_POOL_SPARE_UNUSABLE */
static unsigned alloc_delay_ms;   /* FAKE_CUDA_ALLOC_DELAY_MS */
static unsigned free_delay_ms;    /* FAKE_CUDA_FREE_DELAY_MS */
static uint64_t stream_piece;     /* FAKE_CUDA_STREAM_MB */
static int managed_untouched;     /* FAKE_CUDA_MANAGED_UNTOUCHED */
static int legacy;
static int initialized;

/* one lock for the bookkeeping that is more than a counter: context refcounts, pools, the v1 table.
 * Held across fork (pthread_atfork), so a child forked while another thread holds it is not left
 * with a lock nobody will release. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void mu_lock(void)
{
    pthread_mutex_lock(&mu);
}

static void mu_unlock(void)
{
    pthread_mutex_unlock(&mu);
}

static void default_pools_init(void);

/* ---- FAKE_CUDA_SHARED: one row per process (pid 0 free, -1 being claimed). A process holds an OFD
 * lock on its row's byte past the rows from the start (the library's constructor: a lower descriptor
 * than any the shim opens later): like the real driver's device descriptor, it goes when the process's
 * descriptors close as it dies, and the row's memory counts for nothing from then on. ---- */
#define SHARED_ROWS 256
struct shared_row {
    int32_t pid;
    int32_t pad;
    uint64_t used[MAXDEV];
};
struct shared_file {
    uint64_t seq; /* bumped after every change of a row: fake_used_all's snapshots are consistent */
    uint64_t pad[7];
    struct shared_row rows[SHARED_ROWS];
};
static struct shared_row *rows;
static uint64_t *shared_seq;
static int shared_fd = -1;

static int row_lock(int i, int cmd, short type)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)sizeof(struct shared_file) + i;
    fl.l_len = 1;
    if (fcntl(shared_fd, cmd, &fl) != 0)
        return -1;
    return fl.l_type;
}

/* its process holds the row's lock (our own row counts too: the caller knows its own) */
static int row_alive(int i)
{
    return __atomic_load_n(&rows[i].pid, __ATOMIC_ACQUIRE) > 0 &&
           (dev_used == rows[i].used || row_lock(i, F_OFD_GETLK, F_WRLCK) == F_WRLCK);
}

static void shared_claim(void)
{
    int me = (int)getpid();
    dev_used = own_used;
    for (int i = 0; rows && i < SHARED_ROWS; i++) {
        int seen = __atomic_load_n(&rows[i].pid, __ATOMIC_ACQUIRE);
        if (seen < 0 || (seen > 0 && row_lock(i, F_OFD_GETLK, F_WRLCK) != F_UNLCK) ||
            !__atomic_compare_exchange_n(&rows[i].pid, &seen, -1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            continue;
        if (row_lock(i, F_OFD_SETLK, F_WRLCK) < 0) { /* taken meanwhile */
            __atomic_store_n(&rows[i].pid, seen, __ATOMIC_RELEASE);
            continue;
        }
        for (int d = 0; d < MAXDEV; d++)
            __atomic_store_n(&rows[i].used[d], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&rows[i].pid, me, __ATOMIC_RELEASE); /* after the zeros (fake_used_all) */
        __atomic_fetch_add(shared_seq, 1, __ATOMIC_SEQ_CST);
        dev_used = rows[i].used;
        return;
    }
}

static void shared_open(void)
{
    const char *f = getenv("FAKE_CUDA_SHARED");
    size_t size = sizeof(struct shared_file);
    struct shared_file *m;

    if (!f || !*f || (shared_fd = open(f, O_RDWR | O_CREAT | O_CLOEXEC, 0600)) < 0)
        return;
    if (!rows) {
        m = ftruncate(shared_fd, (off_t)size) == 0 ? mmap(0, size, PROT_READ | PROT_WRITE, MAP_SHARED, shared_fd, 0)
                                                   : MAP_FAILED;
        if (m != MAP_FAILED) {
            rows = m->rows;
            shared_seq = &m->seq;
        }
    }
    shared_claim();
}

static void fork_child(void)
{
    mu_unlock();
    if (shared_fd >= 0) { /* a description of its own (the parent's lock stays the parent's), a row of its own */
        close(shared_fd);
        dev_used = own_used;
        shared_open();
    }
}

EXPORT unsigned long long fake_used_all(int dev)
{
    unsigned long long sum = 0;
    if (!rows)
        return (dev >= 0 && dev < MAXDEV) ? __atomic_load_n(&dev_used[dev], __ATOMIC_RELAXED) : 0;
    for (int tries = 0; dev >= 0 && dev < MAXDEV && tries < 100000; tries++) {
        uint64_t seq = __atomic_load_n(shared_seq, __ATOMIC_SEQ_CST);
        unsigned char counted[SHARED_ROWS];
        int stable = 1;
        sum = 0;
        for (int i = 0; i < SHARED_ROWS; i++) {
            uint64_t v = __atomic_load_n(&rows[i].used[dev], __ATOMIC_SEQ_CST);
            counted[i] = v && row_alive(i);
            /* a dead owner's figure read just before a new owner zeroed the row and made it alive:
             * alive now, the row must still show it */
            if (counted[i] && __atomic_load_n(&rows[i].used[dev], __ATOMIC_SEQ_CST) != v)
                stable = 0;
            if (counted[i])
                sum += v;
        }
        /* a process counted alive that died during the scan may have made room for a use counted
         * after it: not one instant's use either */
        for (int i = 0; i < SHARED_ROWS && stable; i++)
            stable = !counted[i] || row_alive(i);
        if (stable && __atomic_load_n(shared_seq, __ATOMIC_SEQ_CST) == seq)
            return sum; /* no change completed and nobody died meanwhile: one instant's use */
    }
    return sum;
}

__attribute__((constructor)) static void fake_config(void)
{
    const char *s = getenv("FAKE_CUDA_DEVICES");
    if (s)
        ndev = atoi(s) < 0 ? 0 : atoi(s) > MAXDEV ? MAXDEV : atoi(s);
    for (int i = 0; i < MAXDEV; i++)
        phys[i] = i;
    s = getenv("FAKE_CUDA_ORDER");
    if (s) { /* like CUDA_VISIBLE_DEVICES: set but empty means no device; bad entries are skipped */
        int n = 0;
        char *end;
        while (*s && n < MAXDEV) {
            long v = strtol(s, &end, 10);
            if (end != s && v >= 0 && v < MAXDEV)
                phys[n++] = (int)v;
            s = end;
            while (*s && *s != ',')
                s++;
            if (*s == ',')
                s++;
        }
        ndev = n;
    } else {
        int n = fake_visible_order(ndev, phys, MAXDEV);
        if (n >= 0)
            ndev = n;
    }
    s = getenv("FAKE_CUDA_MEM_MB");
    if (s)
        dev_total = strtoull(s, NULL, 10) << 20;
    s = getenv("FAKE_CUDA_CTX_MB");
    if (s)
        ctx_size = strtoull(s, NULL, 10) << 20;
    s = getenv("FAKE_CUDA_POOL_GRANULE_MB");
    if (s)
        pool_granule = strtoull(s, NULL, 10) << 20;
    s = getenv("FAKE_CUDA_POOL_SPARE_UNUSABLE");
    spare_unusable = s && s[0] == '1';
    s = getenv("FAKE_CUDA_ALLOC_DELAY_MS");
    if (s)
        alloc_delay_ms = (unsigned)strtoul(s, NULL, 10);
    s = getenv("FAKE_CUDA_FREE_DELAY_MS");
    if (s)
        free_delay_ms = (unsigned)strtoul(s, NULL, 10);
    s = getenv("FAKE_CUDA_MANAGED_UNTOUCHED");
    managed_untouched = s && s[0] == '1';
    s = getenv("FAKE_CUDA_STREAM_MB");
    if (s)
        stream_piece = strtoull(s, NULL, 10) << 20;
    s = getenv("FAKE_CUDA_LEGACY");
    legacy = s && s[0] == '1';
    default_pools_init();
    shared_open();
    pthread_atfork(mu_lock, mu_unlock, fork_child);
}

/* finalised after the preloaded shim: its destructor has run by now */
__attribute__((destructor)) static void fake_exit_delay(void)
{
    const char *s = getenv("FAKE_CUDA_EXIT_DELAY_MS");
    if (s && atoi(s) > 0)
        usleep((useconds_t)atoi(s) * 1000u);
}

EXPORT unsigned long long fake_used(int dev)
{
    return (dev >= 0 && dev < MAXDEV) ? __atomic_load_n(&dev_used[dev], __ATOMIC_RELAXED) : 0;
}

static uint64_t used_high[MAXDEV];

EXPORT unsigned long long fake_used_high(int dev)
{
    return (dev >= 0 && dev < MAXDEV) ? __atomic_load_n(&used_high[dev], __ATOMIC_RELAXED) : 0;
}

/* what NVML would see on physical device p: every CUDA ordinal that maps onto it */
EXPORT unsigned long long fake_used_physical(int p)
{
    unsigned long long sum = 0;
    for (int i = 0; i < ndev; i++)
        if (phys[i] == p)
            sum += __atomic_load_n(&dev_used[i], __ATOMIC_RELAXED);
    return sum;
}

/* device memory as a counter: charge() fails instead of going over the device's total */
static int charge(int dev, uint64_t size)
{
    uint64_t cur;
    if (dev < 0 || !size)
        return 0;
    cur = __atomic_load_n(&dev_used[dev], __ATOMIC_RELAXED);
    do {
        if (size > dev_total - cur)
            return -1;
    } while (!__atomic_compare_exchange_n(&dev_used[dev], &cur, cur + size, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    for (uint64_t hi = __atomic_load_n(&used_high[dev], __ATOMIC_RELAXED);
         cur + size > hi && !__atomic_compare_exchange_n(&used_high[dev], &hi, cur + size, 1, __ATOMIC_RELAXED,
                                                         __ATOMIC_RELAXED);)
        ;
    if (shared_seq)
        __atomic_fetch_add(shared_seq, 1, __ATOMIC_SEQ_CST);
    return 0;
}

static void uncharge(int dev, uint64_t size)
{
    if (dev >= 0 && size) {
        __atomic_fetch_sub(&dev_used[dev], size, __ATOMIC_RELAXED);
        if (shared_seq)
            __atomic_fetch_add(shared_seq, 1, __ATOMIC_SEQ_CST);
    }
}

/* ---- contexts (current per thread) and streams ---- */
struct CUctx_st {
    unsigned magic;
    int dev;
    int kind; /* CTX_PRIMARY (the zero value), CTX_CREATED, CTX_GREEN */
};
enum { CTX_PRIMARY, CTX_CREATED, CTX_GREEN };
/* a green context is a context underneath: its handle converts to a CUcontext without a lookup */
struct CUgreenCtx_st {
    struct CUctx_st ctx;
};
struct CUstream_st {
    unsigned magic;
    CUcontext ctx;
};
struct CUmemPoolHandle_st {
    unsigned magic;
    CUmemLocation loc;
    int dev;           /* -1: a host pool, its reserve is not device memory */
    int dead;          /* destroyed with allocations outstanding: freed with the last of them */
    uint64_t reserved; /* device memory the pool holds; >= used */
    uint64_t used;     /* handed out and not freed */
    uint64_t threshold; /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: a synchronize keeps this much */
    uint64_t reserved_high, used_high;
    struct CUmemPoolHandle_st *next; /* created pools, for trimming */
};

static struct CUctx_st primary[MAXDEV];
static int primary_refs[MAXDEV];   /* cuDevicePrimaryCtxRetain minus releases */
static int created_ctxs[MAXDEV];   /* live created and green contexts */
static uint64_t ctx_bytes[MAXDEV]; /* the part of dev_used that contexts hold */
static __thread CUcontext ctx_stack[16];
static __thread int ctx_depth; /* ctx_stack[ctx_depth - 1] is current */

static CUcontext current(void)
{
    return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
}

static int valid_ctx(CUcontext c)
{
    return c && c->magic == MAGIC_CTX;
}

EXPORT CUresult cuInit(unsigned int flags)
{
    COUNT(cuInit);
    if (flags)
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < MAXDEV; i++)
        primary[i] = (struct CUctx_st){MAGIC_CTX, i, CTX_PRIMARY};
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

#define NEED_INIT() \
    do { \
        if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE)) \
            return CUDA_ERROR_NOT_INITIALIZED; \
    } while (0)

EXPORT CUresult cuDriverGetVersion(int *v)
{
    COUNT(cuDriverGetVersion);
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *n)
{
    COUNT(cuDeviceGetCount);
    NEED_INIT();
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    *n = ndev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    COUNT(cuDeviceGet);
    NEED_INIT();
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

/* a context costs device memory, as on a real GPU (the NVML per-process figure includes it) */
static int ctx_charge(int dev)
{
    if (charge(dev, ctx_size) != 0)
        return -1;
    ctx_bytes[dev] += ctx_size;
    return 0;
}

static void ctx_uncharge(int dev)
{
    uncharge(dev, ctx_size);
    ctx_bytes[dev] -= ctx_size;
}

EXPORT unsigned long long fake_ctx_bytes(int dev)
{
    unsigned long long b;
    if (dev < 0 || dev >= MAXDEV)
        return 0;
    pthread_mutex_lock(&mu);
    b = ctx_bytes[dev];
    pthread_mutex_unlock(&mu);
    return b;
}

EXPORT int fake_has_ctx(int dev)
{
    int has;
    if (dev < 0 || dev >= MAXDEV)
        return 0;
    pthread_mutex_lock(&mu);
    has = primary_refs[dev] > 0 || created_ctxs[dev] > 0;
    pthread_mutex_unlock(&mu);
    return has;
}

/* the primary context is charged once, by the retain that brings its refcount to 1 */
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CUresult rc = CUDA_SUCCESS;
    COUNT(cuDevicePrimaryCtxRetain);
    NEED_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    if (primary_refs[dev] == 0 && ctx_charge(dev) != 0)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    else
        primary_refs[dev]++;
    pthread_mutex_unlock(&mu);
    if (rc == CUDA_SUCCESS)
        *pctx = &primary[dev];
    return rc;
}

/* active while retained: a shim creating (and measuring) the context only on the first retain asks this */
EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    NEED_INIT();
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *flags = 0;
    *active = __atomic_load_n(&primary_refs[dev], __ATOMIC_RELAXED) > 0;
    return CUDA_SUCCESS;
}

/* a release without a retain stays harmless (success, as before the refcount existed) */
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    COUNT(cuDevicePrimaryCtxRelease_v2);
    if (dev < 0 || dev >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    if (primary_refs[dev] > 0 && --primary_refs[dev] == 0)
        ctx_uncharge(dev);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    COUNT(cuDevicePrimaryCtxReset_v2);
    if (dev < 0 || dev >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    if (primary_refs[dev] > 0)
        ctx_uncharge(dev);
    primary_refs[dev] = 0;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext c)
{
    COUNT(cuCtxSetCurrent);
    if (c && !valid_ctx(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!c) {
        if (ctx_depth)
            ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (!ctx_depth)
        ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pc)
{
    COUNT(cuCtxGetCurrent);
    if (!pc)
        return CUDA_ERROR_INVALID_VALUE;
    *pc = current();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c)
{
    COUNT(cuCtxPushCurrent_v2);
    if (!valid_ctx(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 16)
        return CUDA_ERROR_INVALID_VALUE;
    ctx_stack[ctx_depth++] = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pc)
{
    COUNT(cuCtxPopCurrent_v2);
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    ctx_depth--;
    if (pc)
        *pc = ctx_stack[ctx_depth];
    return CUDA_SUCCESS;
}

/* like the real driver: a thread with no current context gets CUDA_ERROR_INVALID_CONTEXT */
EXPORT CUresult cuCtxGetDevice(CUdevice *d)
{
    COUNT(cuCtxGetDevice);
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (!current())
        return CUDA_ERROR_INVALID_CONTEXT;
    *d = current()->dev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice_v2(CUdevice *d, CUcontext c)
{
    COUNT(cuCtxGetDevice_v2);
    if (legacy)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!c)
        c = current();
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_ctx(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    *d = c->dev;
    return CUDA_SUCCESS;
}

/* ---- created and green contexts ---- */
static CUresult ctx_new(struct CUctx_st *c, int kind, CUdevice dev)
{
    NEED_INIT();
    if (dev < 0 || dev >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    if (ctx_charge(dev) != 0) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    created_ctxs[dev]++;
    pthread_mutex_unlock(&mu);
    *c = (struct CUctx_st){MAGIC_CTX, dev, kind};
    return CUDA_SUCCESS;
}

/* never freed: other threads may still hold the handle on their stacks, and a stale handle must
 * read as invalid (MAGIC_DEAD) rather than as freed memory */
static void ctx_kill(struct CUctx_st *c)
{
    pthread_mutex_lock(&mu);
    ctx_uncharge(c->dev);
    created_ctxs[c->dev]--;
    pthread_mutex_unlock(&mu);
    c->magic = MAGIC_DEAD;
}

/* like CUDA: the new context is pushed onto the calling thread's stack */
static CUresult ctx_create(CUcontext *pctx, CUdevice dev)
{
    struct CUctx_st *c;
    CUresult rc;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (ctx_depth == 16)
        return CUDA_ERROR_INVALID_VALUE;
    c = malloc(sizeof *c);
    if ((rc = ctx_new(c, CTX_CREATED, dev)) != CUDA_SUCCESS) {
        free(c);
        return rc;
    }
    ctx_stack[ctx_depth++] = c;
    *pctx = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)flags;
    COUNT(cuCtxCreate);
    return ctx_create(pctx, dev);
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)flags;
    COUNT(cuCtxCreate_v2);
    return ctx_create(pctx, dev);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice dev)
{
    (void)flags;
    COUNT(cuCtxCreate_v3);
    if (n < 0 || (n > 0 && !params))
        return CUDA_ERROR_INVALID_VALUE;
    return ctx_create(pctx, dev);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev)
{
    (void)params, (void)flags;
    COUNT(cuCtxCreate_v4);
    return ctx_create(pctx, dev);
}

/* created or green contexts only; if it is current here, it is popped (as cuCtxDestroy does) */
static CUresult ctx_destroy(CUcontext c)
{
    if (!valid_ctx(c) || c->kind == CTX_PRIMARY)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (current() == c)
        ctx_depth--;
    ctx_kill(c);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxDestroy(CUcontext c)
{
    COUNT(cuCtxDestroy);
    return ctx_destroy(c);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext c)
{
    COUNT(cuCtxDestroy_v2);
    return ctx_destroy(c);
}

/* a green context is not made current; cuCtxFromGreenCtx gives the CUcontext to use */
EXPORT CUresult cuGreenCtxCreate(CUgreenCtx *pg, CUdevResourceDesc desc, CUdevice dev, unsigned int flags)
{
    struct CUgreenCtx_st *g;
    CUresult rc;
    (void)desc, (void)flags;
    COUNT(cuGreenCtxCreate);
    if (!pg)
        return CUDA_ERROR_INVALID_VALUE;
    g = malloc(sizeof *g);
    if ((rc = ctx_new(&g->ctx, CTX_GREEN, dev)) != CUDA_SUCCESS) {
        free(g);
        return rc;
    }
    *pg = g;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx g)
{
    COUNT(cuGreenCtxDestroy);
    if (!g || !valid_ctx(&g->ctx) || g->ctx.kind != CTX_GREEN)
        return CUDA_ERROR_INVALID_HANDLE;
    return ctx_destroy(&g->ctx);
}

EXPORT CUresult cuCtxFromGreenCtx(CUcontext *pc, CUgreenCtx g)
{
    COUNT(cuCtxFromGreenCtx);
    if (!pc)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g || !valid_ctx(&g->ctx) || g->ctx.kind != CTX_GREEN)
        return CUDA_ERROR_INVALID_HANDLE;
    *pc = &g->ctx;
    return CUDA_SUCCESS;
}

/* ---- UUIDs: derived from the physical index, so a reordering shows ---- */
static CUresult get_uuid(CUuuid *u, CUdevice dev)
{
    static const unsigned char tmpl[16] = {0xfa, 0x4e, 0x00, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0};
    NEED_INIT();
    if (!u)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    memcpy(u->bytes, tmpl, sizeof tmpl);
    u->bytes[3] = u->bytes[15] = (char)phys[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice dev)
{
    COUNT(cuDeviceGetUuid);
    return get_uuid(u, dev);
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice dev)
{
    COUNT(cuDeviceGetUuid_v2);
    return get_uuid(u, dev);
}

static CUresult stream_create(CUstream *ps)
{
    static unsigned long made[MAXDEV];
    struct CUstream_st *s;
    if (!ps)
        return CUDA_ERROR_INVALID_VALUE;
    if (!current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (stream_piece && __atomic_fetch_add(&made[current()->dev], 1, __ATOMIC_RELAXED) % 4 == 1 &&
        charge(current()->dev, stream_piece) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s = malloc(sizeof *s);
    s->magic = MAGIC_STREAM;
    s->ctx = current();
    *ps = s;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreate(CUstream *ps, unsigned int flags)
{
    (void)flags;
    COUNT(cuStreamCreate);
    return stream_create(ps);
}

EXPORT CUresult cuStreamCreateWithPriority(CUstream *ps, unsigned int flags, int priority)
{
    (void)flags;
    (void)priority;
    COUNT(cuStreamCreateWithPriority);
    return stream_create(ps);
}

EXPORT int fake_grow(int dev, unsigned long long bytes)
{
    return charge(dev, bytes);
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s)
{
    COUNT(cuStreamDestroy_v2);
    if (!s || s->magic != MAGIC_STREAM)
        return CUDA_ERROR_INVALID_HANDLE;
    s->magic = 0;
    free(s);
    return CUDA_SUCCESS;
}

static int special_stream(CUstream s)
{
    return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

static CUresult stream_ctx(CUstream s, CUcontext *out)
{
    if (special_stream(s)) {
        if (!current())
            return CUDA_ERROR_INVALID_CONTEXT;
        *out = current();
        return CUDA_SUCCESS;
    }
    if (s->magic != MAGIC_STREAM)
        return CUDA_ERROR_INVALID_HANDLE;
    *out = s->ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext *pctx)
{
    COUNT(cuStreamGetCtx);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    return stream_ctx(s, pctx);
}

EXPORT CUresult cuStreamGetDevice(CUstream s, CUdevice *d)
{
    CUcontext c;
    CUresult rc;
    COUNT(cuStreamGetDevice);
    if (legacy)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = stream_ctx(s, &c)) != CUDA_SUCCESS)
        return rc;
    *d = c->dev;
    return CUDA_SUCCESS;
}

/* ---- memory: a malloc'd header per allocation, its address is the "device pointer" ---- */
struct block {
    unsigned magic;
    int dev; /* -1: host */
    uint64_t size;
    struct CUmemPoolHandle_st *pool; /* stream-ordered: the size came from this pool's reserve */
    int managed;  /* cuMemAllocManaged */
    int imported; /* cuIpcOpenMemHandle: another process's memory, on no device's books here */
};

static uint64_t new_block(int dev, uint64_t size, struct CUmemPoolHandle_st *pool)
{
    struct block *b = malloc(sizeof *b);
    b->magic = MAGIC_MEM;
    b->dev = dev;
    b->size = size;
    b->pool = pool;
    b->managed = b->imported = 0;
    return (uint64_t)(uintptr_t)b;
}

static CUresult take(int dev, uint64_t size, uint64_t *out)
{
    if (!size)
        return CUDA_ERROR_INVALID_VALUE;
    if (charge(dev, size) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = new_block(dev, size, NULL);
    return CUDA_SUCCESS;
}

/* ---- legacy 32-bit device pointers: small handles naming 64-bit blocks ---- */
#define V1_SLOTS 4096
#define V1_BASE 0x1000u
#define V1_STRIDE 16u
static uint64_t v1_block[V1_SLOTS];

static int in_v1_range(uint64_t h)
{
    return h >= V1_BASE && h < V1_BASE + (uint64_t)V1_SLOTS * V1_STRIDE;
}

/* -1: not a v1 handle; -2: inside the handle range but not a slot */
static int v1_slot(uint64_t h)
{
    if (!in_v1_range(h))
        return -1;
    if ((h - V1_BASE) % V1_STRIDE)
        return -2;
    return (int)((h - V1_BASE) / V1_STRIDE);
}

/* the table owns p from here on; a full table is OUT_OF_MEMORY (and p is freed) */
static CUresult v1_put(uint64_t p, CUdeviceptr_v1 *out);

/* a v1 handle resolves to its block and leaves the table (the caller frees the block) */
static uint64_t v1_take_back(uint64_t h)
{
    int slot = v1_slot(h);
    uint64_t p;
    if (slot == -1)
        return h;
    if (slot < 0)
        return UINT64_MAX;
    pthread_mutex_lock(&mu);
    p = v1_block[slot];
    v1_block[slot] = 0;
    pthread_mutex_unlock(&mu);
    return p ? p : UINT64_MAX; /* an unknown handle: not a block, never dereferenced */
}

static void pool_put_back(struct CUmemPoolHandle_st *pool, uint64_t size);

/* any device pointer, v1 handles included (they are addresses in the same space on a real GPU) */
static CUresult give(uint64_t p)
{
    struct block *b;
    if (!p)
        return CUDA_SUCCESS;
    if ((p = v1_take_back(p)) == UINT64_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    b = (struct block *)(uintptr_t)p;
    if (b->magic != MAGIC_MEM)
        return CUDA_ERROR_INVALID_VALUE;
    b->magic = 0;
    if (b->pool)
        pool_put_back(b->pool, b->size);
    else
        uncharge(b->dev, b->size);
    free(b);
    return CUDA_SUCCESS;
}

static CUresult v1_put(uint64_t p, CUdeviceptr_v1 *out)
{
    pthread_mutex_lock(&mu);
    for (int i = 0; i < V1_SLOTS; i++)
        if (!v1_block[i]) {
            v1_block[i] = p;
            pthread_mutex_unlock(&mu);
            *out = V1_BASE + (unsigned)i * V1_STRIDE;
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&mu);
    give(p);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult alloc_current(CUdeviceptr *dptr, uint64_t size)
{
    uint64_t p;
    CUresult rc;
    NEED_INIT();
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    if (!current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (alloc_delay_ms)
        usleep(alloc_delay_ms * 1000u);
    if ((rc = take(current()->dev, size, &p)) == CUDA_SUCCESS)
        *dptr = p;
    return rc;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    COUNT(cuMemAlloc_v2);
    return alloc_current(dptr, size);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
    CUresult rc;
    COUNT(cuMemFree_v2);
    rc = give(p);
    if (free_delay_ms)
        usleep(free_delay_ms * 1000u);
    return rc;
}

static CUresult alloc_pitch(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h, unsigned int esz)
{
    size_t pp;
    CUresult rc;
    if (!pitch || (esz != 4 && esz != 8 && esz != 16) || !w || !h)
        return CUDA_ERROR_INVALID_VALUE;
    pp = (w + 511) & ~(size_t)511;
    if ((rc = alloc_current(dptr, (uint64_t)pp * h)) == CUDA_SUCCESS)
        *pitch = pp;
    return rc;
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h, unsigned int esz)
{
    COUNT(cuMemAllocPitch_v2);
    return alloc_pitch(dptr, pitch, w, h, esz);
}

/* the v1 ABI: the same device memory, 32-bit sizes, handles from the v1 table */
EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int size)
{
    CUdeviceptr p;
    CUresult rc;
    COUNT(cuMemAlloc);
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = alloc_current(&p, size)) != CUDA_SUCCESS)
        return rc;
    return v1_put(p, dptr);
}

EXPORT CUresult cuMemFree(CUdeviceptr_v1 p)
{
    COUNT(cuMemFree);
    if (p && !in_v1_range(p)) /* no 32-bit value outside the table is a block: never dereferenced */
        return CUDA_ERROR_INVALID_VALUE;
    return give(p);
}

EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int w, unsigned int h,
                                unsigned int esz)
{
    CUdeviceptr p;
    size_t pp;
    CUresult rc;
    COUNT(cuMemAllocPitch);
    if (!dptr || !pitch)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = alloc_pitch(&p, &pp, w, h, esz)) != CUDA_SUCCESS)
        return rc;
    if (pp > UINT_MAX) {
        give(p);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if ((rc = v1_put(p, dptr)) == CUDA_SUCCESS)
        *pitch = (unsigned int)pp;
    return rc;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    (void)flags;
    COUNT(cuMemAllocManaged);
    CUresult rc;
    if (managed_untouched && dptr && size && current()) {
        *dptr = new_block(-1, size, NULL); /* on no device's books: give() takes nothing back either */
        ((struct block *)(uintptr_t)*dptr)->managed = 1;
        return CUDA_SUCCESS;
    }
    rc = alloc_current(dptr, size);
    if (rc == CUDA_SUCCESS)
        ((struct block *)(uintptr_t)*dptr)->managed = 1;
    return rc;
}

/* ---- CUDA IPC, pointer and device attributes (passed through by the shim, which must not change them).
 * A handle names the exporter's block by its device, size and pid; an importer gets a block of its own
 * on no device's books (the memory is the exporter's), closed by cuIpcCloseMemHandle. ---- */
#define MAGIC_IPC 0x69706321u
struct ipc_name {
    unsigned magic;
    int dev;
    uint64_t size;
    int pid;
};

static struct block *block_at(CUdeviceptr p) /* a 64-bit pointer this process got from us, else NULL */
{
    struct block *b = (struct block *)(uintptr_t)p;
    return p && !in_v1_range(p) && b->magic == MAGIC_MEM ? b : NULL;
}

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
    struct ipc_name n;
    struct block *b;
    NEED_INIT();
    if (!h || !(b = block_at(p)) || b->imported || b->dev < 0)
        return CUDA_ERROR_INVALID_VALUE;
    memset(h, 0, sizeof *h);
    n.magic = MAGIC_IPC;
    n.dev = b->dev;
    n.size = b->size;
    n.pid = (int)getpid();
    memcpy(h->reserved, &n, sizeof n);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags)
{
    struct ipc_name n;
    memcpy(&n, h.reserved, sizeof n);
    NEED_INIT();
    if (!p || n.magic != MAGIC_IPC || n.dev < 0 || n.dev >= MAXDEV || flags > 1)
        return CUDA_ERROR_INVALID_VALUE;
    if (!current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (n.pid == (int)getpid())
        return CUDA_ERROR_INVALID_CONTEXT; /* the driver refuses a process its own handle */
    *p = new_block(n.dev, n.size, NULL);
    ((struct block *)(uintptr_t)*p)->imported = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
    struct block *b = block_at(p);
    NEED_INIT();
    if (!b || !b->imported)
        return CUDA_ERROR_INVALID_VALUE;
    b->magic = 0;
    free(b);
    return CUDA_SUCCESS;
}

static CUresult pointer_attribute(void *data, CUpointer_attribute a, const struct block *b, CUdeviceptr p)
{
    switch (a) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = b->dev < 0 && !b->managed ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = p;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned int *)data = (unsigned)b->managed;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = b->dev < 0 ? 0 : b->dev;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = (size_t)b->size;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(unsigned int *)data = 1;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p)
{
    struct block *b = block_at(p);
    NEED_INIT();
    if (!data || !b)
        return CUDA_ERROR_INVALID_VALUE;
    return pointer_attribute(data, a, b, p);
}

/* every attribute or none: an error leaves the outputs as they were */
EXPORT CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attrs, void **data, CUdeviceptr p)
{
    unsigned char scratch[16];
    struct block *b = block_at(p);
    NEED_INIT();
    if (!n || !attrs || !data || !b)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++)
        if (!data[i] || pointer_attribute(scratch, attrs[i], b, p) != CUDA_SUCCESS)
            return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++)
        pointer_attribute(data[i], attrs[i], b, p);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice dev)
{
    NEED_INIT();
    if (!v || (int)a <= 0 || a >= CU_DEVICE_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
        *v = 1;
        break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *v = FAKE_SMS;
        break;
    default:
        *v = 0;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
    NEED_INIT();
    if (!can)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= ndev || peer < 0 || peer >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *can = dev != peer;
    return CUDA_SUCCESS;
}

/* ---- stream-ordered pools: a reserve that grows on demand and shrinks on synchronize ---- */
static struct CUmemPoolHandle_st default_pool[MAXDEV];
static struct CUmemPoolHandle_st *current_pool[MAXDEV]; /* cuDeviceSetMemPool; NULL: the default */
static struct CUmemPoolHandle_st *created_pools;         /* under mu */

static void default_pools_init(void)
{
    for (int i = 0; i < MAXDEV; i++) {
        default_pool[i].magic = MAGIC_POOL;
        default_pool[i].loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
        default_pool[i].loc.id = i;
        default_pool[i].dev = i;
    }
}

static int valid_pool(CUmemoryPool pool)
{
    return pool && pool->magic == MAGIC_POOL;
}

static int is_default_pool(CUmemoryPool pool)
{
    return pool >= default_pool && pool < default_pool + MAXDEV;
}

/* the free part of the reserve first; only the shortfall is new device memory */
static CUresult pool_take(struct CUmemPoolHandle_st *pool, uint64_t size, uint64_t *out)
{
    uint64_t avail;
    if (!size)
        return CUDA_ERROR_INVALID_VALUE;
    if (alloc_delay_ms)
        usleep(alloc_delay_ms * 1000u);
    pthread_mutex_lock(&mu);
    avail = spare_unusable ? 0 : pool->reserved - pool->used;
    if (avail < size) {
        uint64_t grow = size - avail;
        if (pool_granule)
            grow = (grow + pool_granule - 1) / pool_granule * pool_granule;
        if (charge(pool->dev, grow) != 0) {
            pthread_mutex_unlock(&mu);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        pool->reserved += grow;
    }
    pool->used += size;
    if (pool->reserved > pool->reserved_high)
        pool->reserved_high = pool->reserved;
    if (pool->used > pool->used_high)
        pool->used_high = pool->used;
    pthread_mutex_unlock(&mu);
    *out = new_block(pool->dev, size, pool);
    return CUDA_SUCCESS;
}

/* a free keeps the memory reserved; a destroyed pool gives it back with its last allocations */
static void pool_put_back(struct CUmemPoolHandle_st *pool, uint64_t size)
{
    int gone = 0;
    pthread_mutex_lock(&mu);
    pool->used -= size;
    if (pool->dead) {
        pool->reserved -= size;
        uncharge(pool->dev, size);
        gone = pool->used == 0;
    }
    pthread_mutex_unlock(&mu);
    if (gone)
        free(pool);
}

/* under mu */
static void pool_trim(struct CUmemPoolHandle_st *pool, uint64_t keep)
{
    if (keep < pool->used)
        keep = pool->used;
    if (pool->reserved > keep) {
        uncharge(pool->dev, pool->reserved - keep);
        pool->reserved = keep;
    }
}

/* what a synchronize does on a real driver: every pool of the device down to its threshold */
static void trim_device(int dev)
{
    if (dev < 0 || dev >= MAXDEV)
        return;
    pthread_mutex_lock(&mu);
    pool_trim(&default_pool[dev], default_pool[dev].threshold);
    for (struct CUmemPoolHandle_st *p = created_pools; p; p = p->next)
        if (p->dev == dev)
            pool_trim(p, p->threshold);
    pthread_mutex_unlock(&mu);
}

static struct CUmemPoolHandle_st *device_current_pool(int dev)
{
    struct CUmemPoolHandle_st *p = __atomic_load_n(&current_pool[dev], __ATOMIC_ACQUIRE);
    return p ? p : &default_pool[dev];
}

static CUresult alloc_on_stream(CUdeviceptr *dptr, size_t size, CUstream s)
{
    CUcontext c;
    uint64_t p;
    CUresult rc;
    NEED_INIT();
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = stream_ctx(s, &c)) != CUDA_SUCCESS)
        return rc;
    if ((rc = pool_take(device_current_pool(c->dev), size, &p)) == CUDA_SUCCESS)
        *dptr = p;
    return rc;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s)
{
    COUNT(cuMemAllocAsync);
    return alloc_on_stream(dptr, size, s);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s)
{
    COUNT(cuMemAllocAsync_ptsz);
    return alloc_on_stream(dptr, size, s);
}

static CUresult alloc_from_pool(CUdeviceptr *dptr, size_t size, CUmemoryPool pool)
{
    uint64_t p;
    CUresult rc;
    NEED_INIT();
    if (!dptr || !valid_pool(pool))
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = pool_take(pool, size, &p)) == CUDA_SUCCESS)
        *dptr = p;
    return rc;
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s)
{
    (void)s;
    COUNT(cuMemAllocFromPoolAsync);
    return alloc_from_pool(dptr, size, pool);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s)
{
    (void)s;
    COUNT(cuMemAllocFromPoolAsync_ptsz);
    return alloc_from_pool(dptr, size, pool);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    (void)s;
    COUNT(cuMemFreeAsync);
    return give(p);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s)
{
    (void)s;
    COUNT(cuMemFreeAsync_ptsz);
    return give(p);
}

static int location_dev(const CUmemLocation *loc, int *dev)
{
    switch (loc->type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        if (loc->id < 0 || loc->id >= ndev)
            return -1;
        *dev = loc->id;
        return 0;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        *dev = -1;
        return 0;
    default:
        return -1;
    }
}

/* VMM needs no context: the location names the device */
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags)
{
    int dev;
    uint64_t p;
    CUresult rc;
    (void)flags;
    COUNT(cuMemCreate);
    NEED_INIT();
    if (!h || !prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    if (location_dev(&prop->location, &dev) != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if ((rc = take(dev, size, &p)) == CUDA_SUCCESS)
        *h = p;
    return rc;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    COUNT(cuMemRelease);
    return h ? give(h) : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    int dev;
    struct CUmemPoolHandle_st *p;
    COUNT(cuMemPoolCreate);
    NEED_INIT();
    if (!pool || !props || location_dev(&props->location, &dev) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    p = calloc(1, sizeof *p);
    p->magic = MAGIC_POOL;
    p->loc = props->location;
    p->dev = dev;
    pthread_mutex_lock(&mu);
    p->next = created_pools;
    created_pools = p;
    pthread_mutex_unlock(&mu);
    *pool = p;
    return CUDA_SUCCESS;
}

/* the free part of the reserve goes back now; what is still allocated, when it is freed (as the
 * real driver defers the release of a pool with outstanding allocations) */
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    int gone;
    COUNT(cuMemPoolDestroy);
    if (!valid_pool(pool) || is_default_pool(pool))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    for (struct CUmemPoolHandle_st **pp = &created_pools; *pp; pp = &(*pp)->next)
        if (*pp == pool) {
            *pp = pool->next;
            break;
        }
    pool_trim(pool, 0);
    pool->magic = 0;
    pool->dead = 1;
    gone = pool->used == 0;
    if (pool->dev >= 0 && current_pool[pool->dev] == pool) /* the device falls back to its default */
        __atomic_store_n(&current_pool[pool->dev], NULL, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&mu);
    if (gone)
        free(pool);
    return CUDA_SUCCESS;
}

static CUresult device_pool(CUmemoryPool *out, CUdevice dev, int current_one)
{
    NEED_INIT();
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *out = current_one ? device_current_pool(dev) : &default_pool[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *out, CUdevice dev)
{
    COUNT(cuDeviceGetDefaultMemPool);
    return device_pool(out, dev, 0);
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *out, CUdevice dev)
{
    COUNT(cuDeviceGetMemPool);
    return device_pool(out, dev, 1);
}

/* the pool must live on that device, as the real driver requires */
EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    COUNT(cuDeviceSetMemPool);
    NEED_INIT();
    if (dev < 0 || dev >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!valid_pool(pool) || pool->dev != dev)
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_store_n(&current_pool[dev], is_default_pool(pool) ? NULL : pool, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    COUNT(cuMemPoolTrimTo);
    if (!valid_pool(pool))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    pool_trim(pool, keep);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    CUresult rc = CUDA_SUCCESS;
    COUNT(cuMemPoolGetAttribute);
    if (!valid_pool(pool) || !value)
        return CUDA_ERROR_INVALID_VALUE;
    if (attr == CU_MEMPOOL_ATTR_LOCATION_TYPE || attr == CU_MEMPOOL_ATTR_LOCATION_ID) {
        if (legacy) /* drivers before CUDA 13 do not know the location attributes */
            return CUDA_ERROR_INVALID_VALUE;
        *(int *)value = attr == CU_MEMPOOL_ATTR_LOCATION_TYPE ? (int)pool->loc.type : pool->loc.id;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&mu);
    switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        *(cuuint64_t *)value = pool->threshold;
        break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
        *(cuuint64_t *)value = pool->reserved;
        break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        *(cuuint64_t *)value = pool->reserved_high;
        break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        *(cuuint64_t *)value = pool->used;
        break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        *(cuuint64_t *)value = pool->used_high;
        break;
    default:
        rc = CUDA_ERROR_NOT_SUPPORTED;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* the threshold, and the high watermarks' reset (value 0, as the real driver accepts) */
EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    CUresult rc = CUDA_SUCCESS;
    cuuint64_t v;
    COUNT(cuMemPoolSetAttribute);
    if (!valid_pool(pool) || !value)
        return CUDA_ERROR_INVALID_VALUE;
    v = *(cuuint64_t *)value;
    pthread_mutex_lock(&mu);
    switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        pool->threshold = v;
        break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        if (v)
            rc = CUDA_ERROR_INVALID_VALUE;
        else
            pool->reserved_high = pool->reserved;
        break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (v)
            rc = CUDA_ERROR_INVALID_VALUE;
        else
            pool->used_high = pool->used;
        break;
    default:
        rc = CUDA_ERROR_NOT_SUPPORTED;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* ---- arrays ---- */
static CUresult array_alloc(void *out, uint64_t w, uint64_t h, uint64_t d, unsigned ch)
{
    uint64_t p;
    CUresult rc;
    NEED_INIT();
    if (!out || !w || !ch)
        return CUDA_ERROR_INVALID_VALUE;
    if (!current())
        return CUDA_ERROR_INVALID_CONTEXT;
    rc = take(current()->dev, w * (h ? h : 1) * (d ? d : 1) * ch, &p);
    if (rc == CUDA_SUCCESS)
        *(void **)out = (void *)(uintptr_t)p;
    return rc;
}

EXPORT CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d)
{
    COUNT(cuArrayCreate_v2);
    return d ? array_alloc(a, d->Width, d->Height, 1, d->NumChannels) : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    COUNT(cuArray3DCreate_v2);
    return d ? array_alloc(a, d->Width, d->Height, d->Depth, d->NumChannels) : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuArrayCreate(CUarray *a, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    COUNT(cuArrayCreate);
    return d ? array_alloc(a, d->Width, d->Height, 1, d->NumChannels) : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuArray3DCreate(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    COUNT(cuArray3DCreate);
    return d ? array_alloc(a, d->Width, d->Height, d->Depth, d->NumChannels) : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuArrayDestroy(CUarray a)
{
    COUNT(cuArrayDestroy);
    return give((uint64_t)(uintptr_t)a);
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    COUNT(cuMipmappedArrayCreate);
    if (!d || !levels)
        return CUDA_ERROR_INVALID_VALUE;
    return array_alloc(a, d->Width * 2, d->Height, d->Depth, d->NumChannels);
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a)
{
    COUNT(cuMipmappedArrayDestroy);
    return give((uint64_t)(uintptr_t)a);
}

/* ---- VMM address space (enough for the GPU probe to dry-run here) ---- */
EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option)
{
    (void)option;
    if (!g || !prop)
        return CUDA_ERROR_INVALID_VALUE;
    *g = 2u << 20;
    return CUDA_SUCCESS;
}

static uint64_t next_va = 0x7f0000000000ull;

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags)
{
    (void)align, (void)addr, (void)flags;
    if (!ptr || !size)
        return CUDA_ERROR_INVALID_VALUE;
    *ptr = __atomic_fetch_add(&next_va, (size + 0xfffff) & ~(uint64_t)0xfffff, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    return ptr && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long flags)
{
    struct block *b = (struct block *)(uintptr_t)h;
    (void)offset, (void)flags;
    if (!ptr || !h || b->magic != MAGIC_MEM || size > b->size)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    return ptr && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    return ptr && size && desc && count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* With fake_events.c linked in and FAKE_GPU set, kernels take time on a GPU the processes share
 * (sim_gpu.h); otherwise they take none. A launch hands over its grid: its blocks, threads per block,
 * dynamic shared memory and stream (the SM model, FAKE_SM_MODEL, places it by them). Weak: the plain
 * fake driver has no such GPU. */
void fake_gpu_launch(unsigned long long blocks, unsigned long long threads, unsigned smem, CUstream s)
    __attribute__((weak));
void fake_gpu_drain(void) __attribute__((weak));

/* synchronizing trims the device's pools to their release thresholds, as the real driver does */
static CUresult stream_sync(CUstream s)
{
    CUcontext c;
    CUresult rc;
    if ((rc = stream_ctx(s, &c)) == CUDA_SUCCESS) {
        trim_device(c->dev);
        if (fake_gpu_drain)
            fake_gpu_drain();
    }
    return rc;
}

EXPORT CUresult cuStreamSynchronize(CUstream s)
{
    COUNT(cuStreamSynchronize);
    return stream_sync(s);
}

EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s)
{
    COUNT(cuStreamSynchronize_ptsz);
    return stream_sync(s);
}

EXPORT CUresult cuCtxSynchronize(void)
{
    COUNT(cuCtxSynchronize);
    if (!current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (fake_gpu_drain)
        fake_gpu_drain();
    trim_device(current()->dev);
    return CUDA_SUCCESS;
}

/* the fake has no events: any handle is "complete"; the current device's pools (every device's,
 * without a current context) are trimmed as by a real event synchronize */
EXPORT CUresult cuEventSynchronize(CUevent e)
{
    (void)e;
    COUNT(cuEventSynchronize);
    if (current())
        trim_device(current()->dev);
    else
        for (int i = 0; i < ndev; i++)
            trim_device(i);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n)
{
    (void)v;
    return p && n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- modules: dummy handles, so the GPU benchmark can dry-run here ---- */
static int dummy_module, dummy_function;

EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image)
{
    if (!m || !image)
        return CUDA_ERROR_INVALID_VALUE;
    *m = (CUmodule)&dummy_module;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    if (!f || !m || !name)
        return CUDA_ERROR_INVALID_VALUE;
    *f = (CUfunction)&dummy_function;
    return CUDA_SUCCESS;
}

/* ---- reporting ---- */
static CUresult mem_info(uint64_t *free_b, uint64_t *total_b)
{
    int dev;
    NEED_INIT();
    if (!current())
        return CUDA_ERROR_INVALID_CONTEXT;
    dev = current()->dev;
    *total_b = dev_total;
    *free_b = dev_total - __atomic_load_n(&dev_used[dev], __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    uint64_t f, t;
    CUresult rc;
    COUNT(cuMemGetInfo_v2);
    NEED_INIT();
    /* as the real driver (580) answers: NULL is no error (a success); the other figure is written */
    if ((rc = mem_info(&f, &t)) == CUDA_SUCCESS) {
        if (free_b)
            *free_b = f;
        if (total_b)
            *total_b = t;
    }
    return rc;
}

/* the v1 ABI cannot say more than 4 GiB: clamped */
EXPORT CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total_b)
{
    uint64_t f, t;
    CUresult rc;
    COUNT(cuMemGetInfo);
    NEED_INIT();
    if (!free_b || !total_b) /* the real driver's v1 answers this, with a context or without */
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((rc = mem_info(&f, &t)) == CUDA_SUCCESS) {
        *free_b = f > UINT_MAX ? UINT_MAX : (unsigned int)f;
        *total_b = t > UINT_MAX ? UINT_MAX : (unsigned int)t;
    }
    return rc;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    COUNT(cuDeviceTotalMem_v2);
    NEED_INIT();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = dev_total;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    COUNT(cuDeviceTotalMem);
    NEED_INIT();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = dev_total > UINT_MAX ? UINT_MAX : (unsigned int)dev_total;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    (void)dst;
    (void)src;
    (void)n;
    COUNT(cuMemcpyHtoD_v2);
    return CUDA_SUCCESS;
}

/* device memory holds nothing here: a read gives zeros (region_gpu.c's trace and clock stamps) */
EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    if (!dst || !src)
        return CUDA_ERROR_INVALID_VALUE;
    memset(dst, 0, n);
    return CUDA_SUCCESS;
}

/* A PASS entry point with six integer arguments: the tests check every one of them survives the
 * trampoline's slow path (first call, before the slot is filled). */
static unsigned long long last_args[6];

EXPORT CUresult cuMemsetD2D32Async(CUdeviceptr dst, size_t pitch, unsigned int ui, size_t w, size_t h, CUstream s)
{
    last_args[0] = dst;
    last_args[1] = pitch;
    last_args[2] = ui;
    last_args[3] = w;
    last_args[4] = h;
    last_args[5] = (unsigned long long)(uintptr_t)s;
    return (CUresult)777;
}

EXPORT void fake_last_args(unsigned long long out[6])
{
    memcpy(out, last_args, sizeof last_args);
}

/* ---- occupancy: an SM of the H200's kind holds 2048 threads, 32 blocks and 228 KiB of shared memory (sm.h) ---- */
EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int threads, size_t smem)
{
    (void)f;
    if (!n || threads <= 0 || threads > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    *n = fake_blocks_per_sm(threads, smem);
    return CUDA_SUCCESS;
}

/* ---- launches: counted, nothing else ---- */
#define KPARAMS CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
    unsigned shmem, CUstream s
#define UNUSED_K (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)s

EXPORT CUresult cuLaunchKernel(KPARAMS, void **params, void **extra)
{
    UNUSED_K, (void)params, (void)extra;
    COUNT(cuLaunchKernel);
    if (fake_gpu_launch)
        fake_gpu_launch((unsigned long long)gx * gy * gz, (unsigned long long)bx * by * bz, shmem, s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel_ptsz(KPARAMS, void **params, void **extra)
{
    UNUSED_K, (void)params, (void)extra;
    COUNT(cuLaunchKernel_ptsz);
    if (fake_gpu_launch)
        fake_gpu_launch((unsigned long long)gx * gy * gz, (unsigned long long)bx * by * bz, shmem, s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchCooperativeKernel(KPARAMS, void **params)
{
    UNUSED_K, (void)params;
    COUNT(cuLaunchCooperativeKernel);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(KPARAMS, void **params)
{
    UNUSED_K, (void)params;
    COUNT(cuLaunchCooperativeKernel_ptsz);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    (void)c, (void)f, (void)params, (void)extra;
    COUNT(cuLaunchKernelEx);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    (void)c, (void)f, (void)params, (void)extra;
    COUNT(cuLaunchKernelEx_ptsz);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s)
{
    (void)g, (void)s;
    COUNT(cuGraphLaunch);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s)
{
    (void)g, (void)s;
    COUNT(cuGraphLaunch_ptsz);
    return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress: (name, introduced in cudaVersion) -> default / per-thread entry; a name
 * may have several rows, the newest one not newer than the caller's cudaVersion answers ---- */
struct proc {
    const char *name;
    int min_version;
    void *fn;
    void *fn_ptsz;
};

/* FAKE_CUDA_PROC_ALIASES=1: cuGetProcAddress hands out internal entry points (same behaviour,
 * other addresses than the exports), as a driver may */
static CUresult internal_alloc(CUdeviceptr *dptr, size_t size)
{
    return cuMemAlloc_v2(dptr, size);
}

static CUresult internal_launch_ptsz(KPARAMS, void **params, void **extra)
{
    return cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

static void *proc_alias(void *fn)
{
    static int aliases = -1;
    if (aliases < 0) {
        const char *e = getenv("FAKE_CUDA_PROC_ALIASES");
        aliases = e && e[0] == '1';
    }
    if (!aliases)
        return fn;
    if (fn == (void *)cuMemAlloc_v2)
        return (void *)internal_alloc;
    if (fn == (void *)cuLaunchKernel_ptsz)
        return (void *)internal_launch_ptsz;
    return fn;
}

EXPORT CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
EXPORT CUresult cuGetProcAddress(const char *, void **, int, cuuint64_t);

static const struct proc procs[] = {
    {"cuInit", 2000, (void *)cuInit, NULL},
    {"cuIpcGetMemHandle", 4010, (void *)cuIpcGetMemHandle, NULL},
    {"cuIpcOpenMemHandle", 11000, (void *)cuIpcOpenMemHandle_v2, NULL},
    {"cuIpcCloseMemHandle", 4010, (void *)cuIpcCloseMemHandle, NULL},
    {"cuPointerGetAttribute", 4000, (void *)cuPointerGetAttribute, NULL},
    {"cuPointerGetAttributes", 7000, (void *)cuPointerGetAttributes, NULL},
    {"cuDeviceGetAttribute", 2000, (void *)cuDeviceGetAttribute, NULL},
    {"cuDeviceCanAccessPeer", 4000, (void *)cuDeviceCanAccessPeer, NULL},
    {"cuDeviceGetCount", 2000, (void *)cuDeviceGetCount, NULL},
    {"cuDeviceGet", 2000, (void *)cuDeviceGet, NULL},
    {"cuDriverGetVersion", 2020, (void *)cuDriverGetVersion, NULL},
    {"cuMemAlloc", 2000, (void *)cuMemAlloc, NULL},
    {"cuMemAlloc", 3020, (void *)cuMemAlloc_v2, NULL},
    {"cuMemFree", 2000, (void *)cuMemFree, NULL},
    {"cuMemFree", 3020, (void *)cuMemFree_v2, NULL},
    {"cuMemAllocPitch", 2000, (void *)cuMemAllocPitch, NULL},
    {"cuMemAllocPitch", 3020, (void *)cuMemAllocPitch_v2, NULL},
    {"cuMemAllocManaged", 6000, (void *)cuMemAllocManaged, NULL},
    {"cuMemGetInfo", 2000, (void *)cuMemGetInfo, NULL},
    {"cuMemGetInfo", 3020, (void *)cuMemGetInfo_v2, NULL},
    {"cuDeviceTotalMem", 2000, (void *)cuDeviceTotalMem, NULL},
    {"cuDeviceTotalMem", 3020, (void *)cuDeviceTotalMem_v2, NULL},
    {"cuArrayCreate", 2000, (void *)cuArrayCreate, NULL},
    {"cuArrayCreate", 3020, (void *)cuArrayCreate_v2, NULL},
    {"cuArray3DCreate", 2000, (void *)cuArray3DCreate, NULL},
    {"cuArray3DCreate", 3020, (void *)cuArray3DCreate_v2, NULL},
    {"cuCtxCreate", 2000, (void *)cuCtxCreate, NULL},
    {"cuCtxCreate", 3020, (void *)cuCtxCreate_v2, NULL},
    {"cuCtxCreate", 11040, (void *)cuCtxCreate_v3, NULL},
    {"cuCtxCreate", 12050, (void *)cuCtxCreate_v4, NULL},
    {"cuCtxDestroy", 2000, (void *)cuCtxDestroy, NULL},
    {"cuCtxDestroy", 4000, (void *)cuCtxDestroy_v2, NULL},
    {"cuGreenCtxCreate", 12040, (void *)cuGreenCtxCreate, NULL},
    {"cuGreenCtxDestroy", 12040, (void *)cuGreenCtxDestroy, NULL},
    {"cuCtxFromGreenCtx", 12040, (void *)cuCtxFromGreenCtx, NULL},
    {"cuDevicePrimaryCtxRelease", 7000, (void *)cuDevicePrimaryCtxRelease_v2, NULL},
    {"cuDevicePrimaryCtxReset", 7000, (void *)cuDevicePrimaryCtxReset_v2, NULL},
    {"cuDeviceGetUuid", 9020, (void *)cuDeviceGetUuid, NULL},
    {"cuDeviceGetUuid", 11040, (void *)cuDeviceGetUuid_v2, NULL},
    {"cuDeviceSetMemPool", 11020, (void *)cuDeviceSetMemPool, NULL},
    {"cuDeviceGetMemPool", 11020, (void *)cuDeviceGetMemPool, NULL},
    {"cuDeviceGetDefaultMemPool", 11020, (void *)cuDeviceGetDefaultMemPool, NULL},
    {"cuMemPoolCreate", 11020, (void *)cuMemPoolCreate, NULL},
    {"cuMemPoolDestroy", 11020, (void *)cuMemPoolDestroy, NULL},
    {"cuMemPoolTrimTo", 11020, (void *)cuMemPoolTrimTo, NULL},
    {"cuMemPoolGetAttribute", 11020, (void *)cuMemPoolGetAttribute, NULL},
    {"cuMemPoolSetAttribute", 11020, (void *)cuMemPoolSetAttribute, NULL},
    {"cuStreamSynchronize", 2000, (void *)cuStreamSynchronize, (void *)cuStreamSynchronize_ptsz},
    {"cuStreamCreate", 2000, (void *)cuStreamCreate, NULL},
    {"cuStreamCreateWithPriority", 5050, (void *)cuStreamCreateWithPriority, NULL},
    {"cuCtxSynchronize", 2000, (void *)cuCtxSynchronize, NULL},
    {"cuEventSynchronize", 2000, (void *)cuEventSynchronize, NULL},
    {"cuMemCreate", 10020, (void *)cuMemCreate, NULL},
    {"cuMemRelease", 10020, (void *)cuMemRelease, NULL},
    {"cuMemAllocAsync", 11020, (void *)cuMemAllocAsync, (void *)cuMemAllocAsync_ptsz},
    {"cuMemAllocFromPoolAsync", 11020, (void *)cuMemAllocFromPoolAsync, (void *)cuMemAllocFromPoolAsync_ptsz},
    {"cuMemFreeAsync", 11020, (void *)cuMemFreeAsync, (void *)cuMemFreeAsync_ptsz},
    {"cuLaunchKernel", 4000, (void *)cuLaunchKernel, (void *)cuLaunchKernel_ptsz},
    {"cuLaunchKernelEx", 11060, (void *)cuLaunchKernelEx, (void *)cuLaunchKernelEx_ptsz},
    {"cuLaunchCooperativeKernel", 9000, (void *)cuLaunchCooperativeKernel, (void *)cuLaunchCooperativeKernel_ptsz},
    {"cuGraphLaunch", 10000, (void *)cuGraphLaunch, (void *)cuGraphLaunch_ptsz},
    {"cuGetProcAddress", 11030, (void *)cuGetProcAddress, NULL},
    {"cuGetProcAddress", 12000, (void *)cuGetProcAddress_v2, NULL},
    {"cuCtxGetDevice", 2000, (void *)cuCtxGetDevice, NULL},
    {"cuDevicePrimaryCtxRetain", 7000, (void *)cuDevicePrimaryCtxRetain, NULL},
    {"cuCtxSetCurrent", 4000, (void *)cuCtxSetCurrent, NULL},
    {"cuMemcpyHtoD", 3020, (void *)cuMemcpyHtoD_v2, NULL},
};

static CUresult lookup(const char *name, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *st)
{
    CUdriverProcAddressQueryResult dummy;
    const struct proc *best = NULL;
    int known = 0;
    if (!st)
        st = &dummy;
    if (!name || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        if (strcmp(procs[i].name, name) != 0)
            continue;
        known = 1;
        if (procs[i].min_version <= ver && (!best || procs[i].min_version > best->min_version))
            best = &procs[i];
    }
    if (!best) {
        *st = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = proc_alias(((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && best->fn_ptsz) ? best->fn_ptsz
                                                                                                : best->fn);
    *st = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress_v2(const char *name, void **pfn, int ver, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *st)
{
    COUNT(cuGetProcAddress_v2);
    return lookup(name, pfn, ver, flags, st);
}

EXPORT CUresult cuGetProcAddress(const char *name, void **pfn, int ver, cuuint64_t flags)
{
    COUNT(cuGetProcAddress);
    return lookup(name, pfn, ver, flags, NULL);
}
