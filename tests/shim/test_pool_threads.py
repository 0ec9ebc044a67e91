"""Stream-ordered allocations from many threads of one process stay under the limit: neither the
pool's reserve (what the device really gave) nor the shared region's sum (claims in flight
included) ever goes over it, while N threads race cuMemAllocAsync / cuMemFreeAsync on one pool
that keeps its reserve, and the pool is trimmed now and then so that it has to grow again."""
from __future__ import annotations

import pytest

from .harness import REGION_SUM_C, Env, region_defines

MiB = 1 << 20
LIMIT_MB = 100

PROGRAM = r"""
#include <cuda.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

unsigned long long fake_used(int dev);

#define CHECK(x) do { CUresult r_ = (x); if (r_) { printf("FAIL %s = %d\n", #x, r_); exit(1); } } while (0)

static CUcontext ctx;
static CUmemoryPool pool;
static long iterations;
static volatile int done;
static uint64_t max_reserve_seen, max_real, max_region, granted, refused;
static const char *region_path;
static pthread_barrier_t start;

static void raise_to(uint64_t *p, uint64_t v)
{
    uint64_t m = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v > m && !__atomic_compare_exchange_n(p, &m, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

/* the region's sum over live slots, as the node monitor computes it (claims in flight included) */
static void *watch_region(void *arg)
{
    int fd = -1;
    const unsigned char *r = MAP_FAILED;
    (void)arg;
    while (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) {
        if (r == MAP_FAILED) {
            if ((fd = open(region_path, O_RDONLY)) >= 0 && lseek(fd, 0, SEEK_END) >= REGION_SIZE)
                r = mmap(0, REGION_SIZE, PROT_READ, MAP_SHARED, fd, 0);
            if (fd >= 0)
                close(fd);
            continue;
        }
        raise_to(&max_region, region_sum(r, 0));
        raise_to(&max_real, fake_used(0));
    }
    return 0;
}

static void *churn(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg * 7919u + 1;
    CUdeviceptr held[4] = {0, 0, 0, 0};
    CUstream s;
    cuuint64_t reserve;
    uint64_t g = 0, f = 0;

    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&s, 0));
    pthread_barrier_wait(&start);   /* all together: the threads overlap */
    for (long i = 0; i < iterations; i++) {
        if (i == 4)
            pthread_barrier_wait(&start); /* each thread holds what its first four got */
        sched_yield();                  /* the pool's lock is not fair: let the others in */
        int k = (int)(i % 4);
        if (held[k]) {
            CHECK(cuMemFreeAsync(held[k], s));
            held[k] = 0;
        }
        if (cuMemAllocAsync(&held[k], ((size_t)(rand_r(&seed) % 16) + 1) << 20, s) == CUDA_SUCCESS) {
            g++;
            CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserve));
            raise_to(&max_reserve_seen, reserve);
        } else {
            held[k] = 0;
            f++;
        }
        if (i % 97 == (long)(uintptr_t)arg)
            CHECK(cuMemPoolTrimTo(pool, 0));   /* the pool must grow again: the racy path */
    }
    for (int k = 0; k < 4; k++)
        if (held[k])
            CHECK(cuMemFreeAsync(held[k], s));
    __atomic_fetch_add(&granted, g, __ATOMIC_RELAXED);
    __atomic_fetch_add(&refused, f, __ATOMIC_RELAXED);
    return 0;
}

int main(int argc, char **argv)
{
    int threads = atoi(argv[1]);
    pthread_t th[64], w;
    cuuint64_t keep = ~0ull, high = 0;
    CUdevice d;

    iterations = atol(argv[2]);
    region_path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    if (threads < 1 || threads > 64)
        return 2;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&d, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, d));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuDeviceGetMemPool(&pool, d));
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep)); /* as PyTorch's backend */
    pthread_barrier_init(&start, 0, (unsigned)threads);
    pthread_create(&w, 0, watch_region, 0);
    for (long t = 0; t < threads; t++)
        pthread_create(&th[t], 0, churn, (void *)t);
    for (int t = 0; t < threads; t++)
        pthread_join(th[t], 0);
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
    pthread_join(w, 0);
    CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &high));
    printf("reserve_high %llu\nreserve_seen %llu\nreal_max %llu\nregion_max %llu\ngranted %llu\nrefused %llu\n",
           (unsigned long long)high, (unsigned long long)max_reserve_seen, (unsigned long long)max_real,
           (unsigned long long)max_region, (unsigned long long)granted, (unsigned long long)refused);
    return 0;
}
"""


@pytest.mark.parametrize("threads", [8, 16])
def test_threaded_pool_allocations_never_exceed_the_limit(env: Env, threads: int) -> None:
    exe = env.compile_c("pool_threads", REGION_SUM_C + PROGRAM, *region_defines(), f"-L{env.fake_dir}",
                        "-l:libcuda.so.1")
    child = env.run_c(exe, {"CUDA_DEVICE_MEMORY_LIMIT": f"{LIMIT_MB}m"}, args=[str(threads), "10000"], timeout=120)
    assert child.rc == 0, (child.rc, child.stdout, child.stderr)
    r = {k: int(v) for k, v in (line.split() for line in child.stdout.splitlines())}
    limit = LIMIT_MB * MiB
    assert r["granted"] > 1000 and r["refused"] > 100, r   # the limit was crossed again and again
    assert r["reserve_high"] <= limit, f"the pool's reserve reached {r['reserve_high'] / MiB:.1f} MiB: {r}"
    assert r["real_max"] <= limit, r
    assert r["region_max"] <= limit, f"the region's sum reached {r['region_max'] / MiB:.1f} MiB: {r}"
