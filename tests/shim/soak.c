/* The threaded soak's program (tests/shim/test_soak.py over the fake driver, tests/gpu/test_soak_gpu.py on
 * the real one):
 *   soak worker THREADS SECONDS   allocate and free in THREADS threads until SECONDS pass; "ready" first
 *   soak watch LIMIT              sample the container's physical use (the fake's rows) and the region's sum
 *                                 until stdin closes (the region offsets come as -D flags)
 *   soak whole BYTES              one allocation of BYTES */
#include <cuda.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

unsigned long long fake_used_all(int dev) __attribute__((weak)); /* the fake's; tests/gpu runs workers only */

#define CHECK(x) do { CUresult r_ = (x); if (r_) { printf("FAIL %s = %d\n", #x, r_); exit(1); } } while (0)
enum { SYNC, ASYNC, POOLED, MANAGED, VMM, KINDS };

static CUcontext ctx;
static CUmemoryPool created;
static double deadline;
static uint64_t granted[KINDS], refused[KINDS];
static int kinds[KINDS] = {SYNC, ASYNC, POOLED, MANAGED, VMM}, nkinds = KINDS;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

struct held { int kind; CUdeviceptr p; CUmemGenericAllocationHandle h; };

static void drop(struct held *a, CUstream s)
{
    switch (a->kind) {
    case SYNC: case MANAGED: CHECK(cuMemFree(a->p)); break;
    case ASYNC: case POOLED: CHECK(cuMemFreeAsync(a->p, s)); break;
    case VMM: CHECK(cuMemRelease(a->h)); break;
    }
    a->kind = -1;
}

static int take(struct held *a, int kind, size_t size, CUstream s)
{
    CUmemAllocationProp prop;
    CUresult rc;

    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    switch (kind) {
    case SYNC: rc = cuMemAlloc(&a->p, size); break;
    case ASYNC: rc = cuMemAllocAsync(&a->p, size, s); break;
    case POOLED: rc = cuMemAllocFromPoolAsync(&a->p, size, created, s); break;
    case MANAGED: rc = cuMemAllocManaged(&a->p, size, CU_MEM_ATTACH_GLOBAL); break;
    default: rc = cuMemCreate(&a->h, size, &prop, 0); break;
    }
    if (rc == CUDA_SUCCESS) {
        a->kind = kind;
        __atomic_fetch_add(&granted[kind], 1, __ATOMIC_RELAXED);
        return 1;
    }
    if (rc != CUDA_ERROR_OUT_OF_MEMORY) {
        printf("FAIL kind %d size %zu = %d\n", kind, size, rc);
        exit(1);
    }
    __atomic_fetch_add(&refused[kind], 1, __ATOMIC_RELAXED);
    return 0;
}

static CUstream streams[64];

static void *churn(void *arg)
{
    unsigned seed = (unsigned)getpid() * 7919u + (unsigned)(uintptr_t)arg;
    struct held held[4] = {{-1, 0, 0}, {-1, 0, 0}, {-1, 0, 0}, {-1, 0, 0}};
    CUstream s = streams[(uintptr_t)arg];
    long i;

    CHECK(cuCtxSetCurrent(ctx));
    for (i = 0; now() < deadline; i++) {
        struct held *a = &held[i % 4];
        if (a->kind >= 0)
            drop(a, s);
        take(a, kinds[rand_r(&seed) % nkinds], ((size_t)(rand_r(&seed) % 8) + 1) << 21, s);
        if (i % 211 == 0) {
            CUmemoryPool dflt;
            CHECK(cuDeviceGetMemPool(&dflt, 0));
            CHECK(cuMemPoolTrimTo(rand_r(&seed) % 2 ? dflt : created, 0)); /* the pools must grow again */
        }
    }
    for (int k = 0; k < 4; k++)
        if (held[k].kind >= 0)
            drop(&held[k], s);
    CHECK(cuStreamSynchronize(s));
    return 0;
}

static int worker(int threads, double seconds)
{
    pthread_t th[64];
    cuuint64_t keep = ~0ull;
    CUmemoryPool dflt;
    CUmemPoolProps props;
    CUdevice d;

    const char *only = getenv("VGPU_SOAK_KINDS"); /* e.g. "12": async and pooled only (to bisect) */
    if (only && *only)
        for (nkinds = 0; only[nkinds] && nkinds < KINDS; nkinds++)
            kinds[nkinds] = only[nkinds] - '0';
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&d, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, d));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuDeviceGetMemPool(&dflt, d));
    CHECK(cuMemPoolSetAttribute(dflt, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep)); /* as PyTorch's backend */
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CHECK(cuMemPoolCreate(&created, &props));
    CHECK(cuMemPoolSetAttribute(created, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
    /* a stream may take device memory (the driver's state for it): in a full container refused, as
     * the context may be, before "ready" */
    for (int t = 0; t < threads; t++)
        CHECK(cuStreamCreate(&streams[t], 0));
    printf("ready\n");
    fflush(stdout);
    deadline = now() + seconds;
    for (long t = 0; t < threads; t++)
        pthread_create(&th[t], 0, churn, (void *)t);
    for (int t = 0; t < threads; t++)
        pthread_join(th[t], 0);
    CHECK(cuMemPoolDestroy(created));
    for (int k = 0; k < KINDS; k++)
        printf("kind %d granted %llu refused %llu\n", k, (unsigned long long)granted[k],
               (unsigned long long)refused[k]);
    return 0;
}

/* the region's sum at one instant: two scans in a row that read the same slots (a single scan can
 * mix one process's use before a free with another's after the allocation that free made room for) */
static uint64_t region_sum_now(const unsigned char *r, int *n)
{
    static uint64_t seen[2][2 * 1024];
    uint64_t sum = 0;

    for (int tries = 0; tries < 1000; tries++) {
        for (int k = 0; k < 2; k++) {
            *n = __atomic_load_n((const int *)(r + PROC_NUM_OFF), __ATOMIC_ACQUIRE);
            for (int i = 0; i < *n && i < 1024; i++) {
                const unsigned char *s = r + PROCS_OFF + (size_t)i * SLOT_SIZE;
                seen[k][2 * i] = __atomic_load_n((const int *)(s + STATUS_OFF), __ATOMIC_ACQUIRE);
                seen[k][2 * i + 1] = __atomic_load_n((const uint64_t *)(s + USED0_OFF), __ATOMIC_ACQUIRE);
            }
        }
        if (!memcmp(seen[0], seen[1], sizeof(uint64_t) * 2 * (size_t)(*n < 1024 ? *n : 1024)))
            break;
    }
    for (int i = 0; i < *n && i < 1024; i++)
        if (seen[0][2 * i])
            sum += seen[0][2 * i + 1];
    return sum;
}

/* the container's physical use (every live process's rows) and the region's sum of live slots,
 * each at one instant, sampled until stdin closes */
static int watch(const char *region_path, uint64_t limit)
{
    uint64_t max_phys = 0, max_region = 0, samples = 0, last = 0;
    const unsigned char *r = MAP_FAILED, *dev = MAP_FAILED;
    int fd = open(getenv("FAKE_CUDA_SHARED"), O_RDONLY), told = 0;
    char c;

    if (fd >= 0) /* the fake's rows (fake_cuda.c: seq, padding, then pid, pad, used[16] a row) */
        dev = mmap(0, 64 + 64 * (8 + 8 * 16), PROT_READ, MAP_SHARED, fd, 0);

    fcntl(0, F_SETFL, O_NONBLOCK);
    printf("watching\n");
    fflush(stdout);
    while (read(0, &c, 1) != 0) {
        if (r == MAP_FAILED && (fd = open(region_path, O_RDONLY)) >= 0) {
            if (lseek(fd, 0, SEEK_END) >= REGION_SIZE)
                r = mmap(0, REGION_SIZE, PROT_READ, MAP_SHARED, fd, 0);
            close(fd);
        }
        last = fake_used_all(0);
        if (last > max_phys)
            max_phys = last;
        if (r != MAP_FAILED) {
            int n;
            uint64_t sum = region_sum_now(r, &n);
            if (sum > max_region)
                max_region = sum;
            if ((last > limit || sum > limit) && !told++) { /* the first time over: who held what (MiB) */
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                printf("over %llu/%llu at %.3f region", (unsigned long long)last >> 20, (unsigned long long)sum >> 20,
                       ts.tv_sec + ts.tv_nsec / 1e9);
                for (int i = 0; i < n && i < 1024; i++) { /* pid:status:used[:exit hold] */
                    const unsigned char *s = r + PROCS_OFF + (size_t)i * SLOT_SIZE;
                    uint64_t hold = *(const uint64_t *)(s + HOLD0_OFF);
                    if (*(const int *)s)
                        printf(hold ? " %d:%d:%llu:%llu" : " %d:%d:%llu", *(const int *)s,
                               *(const int *)(s + STATUS_OFF),
                               (unsigned long long)*(const uint64_t *)(s + USED0_OFF) >> 20,
                               (unsigned long long)hold >> 20);
                }
                printf(" device"); /* pid:used */
                for (int i = 0; dev != MAP_FAILED && i < 64; i++) {
                    const unsigned char *w = dev + 64 + (size_t)i * (8 + 8 * 16);
                    if (*(const int *)w > 0 && *(const uint64_t *)(w + 8))
                        printf(" %d:%llu", *(const int *)w, (unsigned long long)*(const uint64_t *)(w + 8) >> 20);
                }
                printf("\n");
            }
        }
        samples++;
    }
    printf("max_phys %llu\nmax_region %llu\nsamples %llu\nlast_phys %llu\n", (unsigned long long)max_phys,
           (unsigned long long)max_region, (unsigned long long)samples, (unsigned long long)fake_used_all(0));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "worker"))
        return worker(atoi(argv[2]), atof(argv[3]));
    if (argc == 3 && !strcmp(argv[1], "watch"))
        return watch(getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE"), strtoull(argv[2], 0, 10));
    if (argc == 3 && !strcmp(argv[1], "whole")) { /* one allocation of the whole limit */
        CUdeviceptr p;
        CUcontext c;
        CHECK(cuInit(0));
        CHECK(cuDevicePrimaryCtxRetain(&c, 0));
        CHECK(cuCtxSetCurrent(c));
        CHECK(cuMemAlloc(&p, strtoull(argv[2], 0, 10)));
        CHECK(cuMemFree(p));
        printf("whole ok\n");
        return 0;
    }
    return 2;
}
