"""The threaded soak: many processes x threads mixing sync, async (the default pool), pooled (a created
pool), managed and VMM allocations under one container limit, processes SIGKILLed at random and restarted.
The fake driver's devices are shared by the processes (FAKE_CUDA_SHARED), so what a watcher samples is
the container's physical use, transient claims and pool reserves included: it must never be above the
limit, also while processes exit or die (their memory counts until they are gone:
tests/region/test_region_exit.py). Nor may the sum of the region's live slots, the figure HAMi's monitor
reads (each sampled at one instant). After everything exited nothing is left: no physical use, and a new
process gets the whole limit.

About 20 s here; VGPU_SOAK_SECONDS=600 (and VGPU_SOAK_PROCS, VGPU_SOAK_THREADS) for a longer run, and to
bisect a failure VGPU_SOAK_KINDS=12 (only kinds 1 and 2: 0 sync, 1 async, 2 pooled, 3 managed, 4 VMM) and
VGPU_SOAK_KILLS=0 (no kills).
"""
from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time

from .harness import Env, region_defines

MiB = 1 << 20
LIMIT_MB = 256

PROGRAM = r"""
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

unsigned long long fake_used_all(int dev);

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

static void *churn(void *arg)
{
    unsigned seed = (unsigned)getpid() * 7919u + (unsigned)(uintptr_t)arg;
    struct held held[4] = {{-1, 0, 0}, {-1, 0, 0}, {-1, 0, 0}, {-1, 0, 0}};
    CUstream s;
    long i;

    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&s, 0));
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
"""


def _env(env: Env, shared: str, cache: str, preload: bool) -> dict[str, str]:
    e = env.base_env({"CUDA_DEVICE_MEMORY_LIMIT": f"{LIMIT_MB}m", "FAKE_CUDA_SHARED": shared,
                      "CUDA_DEVICE_MEMORY_SHARED_CACHE": cache})
    e["LD_LIBRARY_PATH"] = str(env.fake_dir) + (":" + e["LD_LIBRARY_PATH"] if e.get("LD_LIBRARY_PATH") else "")
    if preload:
        e["LD_PRELOAD"] = str(env.shim)
    return e


def test_threaded_soak_with_random_kills_never_exceeds_the_limit(env: Env) -> None:
    seconds = float(os.environ.get("VGPU_SOAK_SECONDS", "20"))
    procs = int(os.environ.get("VGPU_SOAK_PROCS", "4"))
    threads = int(os.environ.get("VGPU_SOAK_THREADS", "4"))
    exe = env.compile_c("soak", PROGRAM, *region_defines(), f"-L{env.fake_dir}", "-l:libcuda.so.1")
    shared, cache = str(env.tmp / "device"), str(env.tmp / "region")
    worker_env, plain_env = _env(env, shared, cache, True), _env(env, shared, cache, False)
    rng = random.Random(20)
    children: list[subprocess.Popen] = []
    events: list[str] = []  # "time pid what", for the report of a failure

    def event(p: subprocess.Popen, what: str) -> None:
        events.append(f"{time.monotonic():.3f} {p.pid} {what}")

    def spawn(args: list[str], e: dict[str, str], stdin: int | None = subprocess.DEVNULL) -> subprocess.Popen:
        # the shim's refusal warnings go to a file: a pipe nobody reads would stall a long run
        with open(env.tmp / "stderr", "a") as err:
            p = subprocess.Popen([str(exe), *args], env=e, stdin=stdin, stdout=subprocess.PIPE, stderr=err,
                                 text=True, start_new_session=True)
        children.append(p)
        event(p, "started")
        assert p.stdout is not None and p.stdout.readline().strip() in ("ready", "watching"), p.stdout.read()
        return p

    watcher = spawn(["watch", str(LIMIT_MB * MiB)], plain_env, stdin=subprocess.PIPE)
    kills = 0
    try:
        end = time.monotonic() + seconds
        running = [spawn(["worker", str(threads), str(seconds)], worker_env) for _ in range(procs)]
        finished: list[subprocess.Popen] = []
        while time.monotonic() < end - 1 and os.environ.get("VGPU_SOAK_KILLS") != "0":
            time.sleep(rng.uniform(0.2, 0.8))
            victim = running.pop(rng.randrange(len(running)))
            event(victim, "killed")
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=10)
            event(victim, "reaped")
            kills += 1
            running.append(spawn(["worker", str(threads), str(max(0.5, end - time.monotonic()))], worker_env))
        for p in running:
            p.wait(timeout=seconds + 60)
            event(p, "exited")
            finished.append(p)
        time.sleep(0.2)  # the watcher's last samples: nothing may be left
        out, _ = watcher.communicate("", timeout=30)
    finally:
        for p in children:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    r = {k: int(v) for k, v in (ln.split() for ln in out.splitlines() if not ln.startswith("over"))}
    over = next((ln for ln in out.splitlines() if ln.startswith("over")), "")  # MiB by pid, the first time
    if over:  # what the processes did around it
        at = float(over.split()[3])
        over += "; around it: " + ", ".join(e for e in events if abs(float(e.split()[0]) - at) < 2)
    limit = LIMIT_MB * MiB
    for p in finished:
        assert p.returncode == 0, (p.returncode, p.stdout.read() if p.stdout else "")
    stats = [line.split() for p in finished for line in (p.stdout.read() if p.stdout else "").splitlines()]
    granted = [sum(int(s[3]) for s in stats if s[0] == "kind" and s[1] == str(k)) for k in range(5)]
    refused = sum(int(s[5]) for s in stats if s[0] == "kind")
    assert (kills >= 3 or os.environ.get("VGPU_SOAK_KILLS") == "0") and r["samples"] > 1000, (kills, r)
    assert r["max_phys"] <= limit, f"physical use reached {r['max_phys'] / MiB:.1f} MiB of {LIMIT_MB}: {r}, {over}"
    assert r["max_region"] <= limit, f"the region's sum reached {r['max_region'] / MiB:.1f} MiB: {r}, {over}"
    if not os.environ.get("VGPU_SOAK_KINDS"):
        assert all(granted) and refused, f"every kind was granted and the limit was reached: {granted}, {refused}"
    assert r["last_phys"] == 0, f"memory left after every process exited: {r}"
    whole = subprocess.run([str(exe), "whole", str(limit)], env=worker_env, capture_output=True, text=True,
                           timeout=60)
    assert whole.stdout.strip() == "whole ok", (whole.stdout, whole.stderr)
