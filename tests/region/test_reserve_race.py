"""Lock-free reserve (c_src/region/slots.c): real processes (and threads) race reserves across the limit.

Every reserve publishes its claim, then sums; a race may refuse a request that would have fitted,
but the claims granted never add up to more than the limit, and no withdrawn claim stays behind.

The racer below is a small C program on the region layer alone. Its processes churn around the
limit (reserve until refused, then give back half of what they hold), so the limit is crossed
thousands of times. Beside the region they keep an oracle in a shared file: a grant is added to
it after the reserve returns and taken off before the release, so the oracle never exceeds what
the region has really granted; if it ever goes over the limit, the region did.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from regiontools import REGION_SOURCES, Held, build_program, lines, run_tool

from vgpu_patch.shim import region as R

UNIT = 4096
LIMIT = 64 * UNIT  # small: a few chunks, so the racers keep crossing it

RACER = r"""
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "limits/limits.h"
#include "log/log.h"
#include "region/region.h"

#define IN_FORCE(d) vgpu_limit_in_force(vgpu_region_stored_limit(d), vgpu_limits_env(d))

struct oracle { uint64_t held, max_held, violations, max_seen; };
static struct oracle *o;
static uint64_t limit, chunk;
static long iterations;
static uint64_t granted, refused, kept; /* totals over this process's threads */

static void *churn(void *arg)
{
    uint64_t mine = 0, g = 0, f = 0, h, m;
    long i;

    (void)arg;
    for (i = 0; i < iterations; i++) {
        if (vgpu_region_reserve(0, chunk, IN_FORCE(0)) == 0) {
            h = __atomic_add_fetch(&o->held, chunk, __ATOMIC_SEQ_CST);
            if (h > limit)
                __atomic_fetch_add(&o->violations, 1, __ATOMIC_RELAXED);
            m = __atomic_load_n(&o->max_held, __ATOMIC_RELAXED);
            while (h > m && !__atomic_compare_exchange_n(&o->max_held, &m, h, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                ;
            mine++;
            g++;
        } else {
            uint64_t n = (mine + 1) / 2; /* give back half: the limit is crossed again soon */
            f++;
            __atomic_fetch_sub(&o->held, n * chunk, __ATOMIC_SEQ_CST);
            vgpu_region_release(0, n * chunk);
            mine -= n;
        }
    }
    __atomic_fetch_add(&granted, g, __ATOMIC_RELAXED);
    __atomic_fetch_add(&refused, f, __ATOMIC_RELAXED);
    __atomic_fetch_add(&kept, mine * chunk, __ATOMIC_RELAXED);
    return 0;
}

/* what HAMi's monitor sees, lock-free: the sum of used[0].total over live slots; the largest seen in a
 * consistent view (two passes that read the same values: a sum of values read while others move
 * could add a slot's old value to another's new one and exceed the limit without the region ever doing so) */
static volatile int racing = 1;
static int view(const vgpu_region_t *r, uint64_t *v)
{
    int i, n = __atomic_load_n(&r->proc_num, __ATOMIC_ACQUIRE);
    for (i = 0; i < n && i < 64; i++)
        v[i] = __atomic_load_n(&r->procs[i].status, __ATOMIC_ACQUIRE)
                   ? __atomic_load_n(&r->procs[i].used[0].total, __ATOMIC_ACQUIRE) : 0;
    return i;
}
static void *watch(void *arg)
{
    const vgpu_region_t *r = vgpu_region_get();
    uint64_t a[64], b[64];
    (void)arg;
    while (racing) {
        uint64_t sum = 0, m;
        int i, n = view(r, a);
        if (view(r, b) != n || memcmp(a, b, (size_t)n * sizeof a[0]))
            continue;
        for (i = 0; i < n; i++)
            sum += a[i];
        m = __atomic_load_n(&o->max_seen, __ATOMIC_RELAXED);
        while (sum > m && !__atomic_compare_exchange_n(&o->max_seen, &m, sum, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            ;
    }
    return 0;
}

/* racer ORACLE_FILE ITERATIONS CHUNK THREADS: attach, print "ready", wait for a line, race,
 * print "done GRANTED REFUSED KEPT_BYTES", wait for a line (still holding KEPT_BYTES), exit */
int main(int argc, char **argv)
{
    vgpu_region_config_t cfg;
    pthread_t th[16];
    char line[16];
    int fd, t, threads;

    if (argc != 5)
        return 2;
    iterations = atol(argv[2]);
    chunk = strtoull(argv[3], 0, 10);
    threads = atoi(argv[4]);
    if (threads < 1 || threads > 16)
        return 2;
    vgpu_log_init_from_env();
    vgpu_limits_load_env();
    memset(&cfg, 0, sizeof cfg);
    cfg.device_count = 1;
    vgpu_region_config_from_env(&cfg);
    if (vgpu_region_attach(0, &cfg) != 0)
        return 3;
    limit = vgpu_region_get()->limit[0];
    fd = open(argv[1], O_RDWR);
    o = mmap(0, sizeof *o, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd < 0 || o == MAP_FAILED)
        return 4;
    setvbuf(stdout, 0, _IOLBF, 0);
    printf("ready\n");
    if (!fgets(line, sizeof line, stdin))
        return 5;
    pthread_t watcher;
    pthread_create(&watcher, 0, watch, 0);
    for (t = 0; t < threads; t++)
        pthread_create(&th[t], 0, churn, 0);
    for (t = 0; t < threads; t++)
        pthread_join(th[t], 0);
    racing = 0;
    pthread_join(watcher, 0);
    printf("done %llu %llu %llu\n", (unsigned long long)granted, (unsigned long long)refused,
           (unsigned long long)kept);
    if (!fgets(line, sizeof line, stdin))
        line[0] = 0;
    return 0;
}
"""


@pytest.fixture(scope="module")
def racer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_program(tmp_path_factory.mktemp("racer"), "racer", RACER, *REGION_SOURCES)


def _oracle(path: Path) -> tuple[int, int, int, int]:
    b = path.read_bytes()
    return tuple(int.from_bytes(b[i:i + 8], "little") for i in (0, 8, 16, 24))  # type: ignore[return-value]


@pytest.mark.parametrize("procs,threads,chunks", [(4, 1, [1]), (3, 1, [1, 2, 3, 5]), (3, 2, [3, 7])],
                         ids=["equal", "mixed", "threads"])
def test_racing_reserves_never_exceed_the_limit(racer: Path, region_tool: Path, region_env: dict, tmp_path: Path,
                                                procs: int, threads: int, chunks: list[int]) -> None:
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": str(LIMIT)}
    oracle = tmp_path / "oracle"
    oracle.write_bytes(bytes(32))
    sizes = [chunks[i % len(chunks)] * UNIT for i in range(procs)]
    ps = [subprocess.Popen([str(racer), str(oracle), "20000", str(size), str(threads)], env=env,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for size in sizes]
    try:
        for p in ps:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        for p in ps:  # all attached and parked: let them go back to back
            p.stdin.write("\n")
            p.stdin.flush()
        done = [p.stdout.readline().split() for p in ps]
        assert all(d[0] == "done" for d in done), done
        granted, refused, kept = (sum(int(d[i]) for d in done) for i in (1, 2, 3))
        held, max_held, violations, max_seen = _oracle(oracle)
        assert violations == 0 and max_held <= LIMIT, (max_held, LIMIT)
        # nor does the monitor's lock-free view, claims in flight included
        assert max_seen <= LIMIT, (max_seen, LIMIT)
        assert refused > 100 and granted > 100  # the limit was really crossed, many times
        used = R.read_region(Path(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])).used(0)
        assert used == kept == held <= LIMIT  # every withdrawn claim is gone, every grant counted
        # what is left can be taken exactly, and not one byte more
        rest = LIMIT - used
        steps = ["attach"] + ([f"reserve:0:{rest}"] if rest else []) + ["reserve:0:1", "used:0"]
        out = lines(run_tool(region_tool, env, *steps))
        assert out == ["attach ok"] + (["reserve ok"] if rest else []) + ["reserve refused", f"used {LIMIT}"]
    finally:
        for p in ps:
            if p.poll() is None:
                p.communicate("\n", timeout=30)
    assert R.read_region(Path(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])).used(0) == 0


def test_reserve_under_the_limit_does_not_wait_for_the_lock(region_tool: Path, region_env: dict) -> None:
    """A peer holding the region lock (stopped, say) no longer stalls allocations that fit: the old
    locked path waited 5 s for it, then warned "region lock not obtained"."""
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    # attached (attach takes the lock) and parked before the holder takes the lock
    user = subprocess.Popen([str(region_tool), "attach", "wait", "reserve:0:1048576", "used:0", "wait"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    holder = None
    try:
        assert user.stdout.readline().strip() == "attach ok"
        holder = Held(region_tool, env, "attach", "lockhold:60000")
        assert holder.lines == ["attach ok", "locked"]
        user.stdin.write("\n")
        user.stdin.flush()
        got = [user.stdout.readline().strip() for _ in range(3)]
        assert got == ["woke", "reserve ok", "used 1048576"]
    finally:
        user.kill()  # not a normal exit: freeing its slot at exit would wait for the lock
        err = user.communicate(timeout=30)[1]
        if holder:
            holder.kill()
    assert "region lock" not in err
