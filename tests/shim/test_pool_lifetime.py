"""A pool's memory stays charged for as long as the device holds it: after the pool is destroyed
with allocations outstanding (CUDA allows it and keeps them until they are freed), and for every
pool of a process that uses many (the table grows; beyond its bound allocations are refused with
one warning, never let through uncharged). NVML's process list is made to fail here: its
per-process figure would otherwise mend a missed charge at the next refusal, and these tests are
about the pools' own accounting."""
from __future__ import annotations

from .harness import Env

MiB = 1 << 20
LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT": "1000m", "FAKE_NVML_PROCS_FAIL": "1"}

POOLS = """
assert shim.cuInit(0) == 0
ctx_on(0)
s = ffi.new("CUstream *")  # the default stream: without NVML a stream made through the shim stays charged 2 MiB
props = ffi.new("CUmemPoolProps *"); props.allocType = 1; props.location.type = 1; props.location.id = 0

def new_pool():
    pool = ffi.new("CUmemoryPool *")
    assert shim.cuMemPoolCreate(pool, props) == 0
    return pool[0]

def pool_alloc(pool, size):
    p = ffi.new("CUdeviceptr *")
    rc = shim.cuMemAllocFromPoolAsync(p, size, pool, s[0])
    return rc, p[0]
"""


def test_destroyed_pool_keeps_its_outstanding_memory_charged(env: Env) -> None:
    r = env.run_py(POOLS + """
pool = new_pool()
rc, p = pool_alloc(pool, 600 * MiB)
assert rc == 0
assert shim.cuMemPoolDestroy(pool) == 0          # allowed: the 600 MiB stay allocated until freed
held = meminfo()
refused = alloc(600 * MiB)[0]
real = fake.fake_used(0)
assert shim.cuMemFreeAsync(p, s[0]) == 0          # now the driver gives it back
ok, q = alloc(600 * MiB)
emit(held=held, refused=refused, real=real, ok=ok, info=meminfo())
""", LIMIT).result
    assert r["held"][1] == 400 * MiB, r
    assert r["refused"] == 2, r          # 600 still held + 600 > 1000
    assert r["real"] <= 1000 * MiB
    assert r["ok"] == 0, r               # the charge went with the memory
    assert r["info"][1] == 400 * MiB, r


def test_many_pools_are_all_charged(env: Env) -> None:
    child = env.run_py(POOLS + """
def use(pool, size):                              # the pool keeps the memory reserved after the free
    rc, p = pool_alloc(pool, size)
    if rc == 0:
        assert shim.cuMemFreeAsync(p, s[0]) == 0
    return rc

small = [use(new_pool(), 4096) for _ in range(130)]
big = [use(new_pool(), 20 * MiB) for _ in range(100)]
emit(small=small.count(0), ok=big.count(0), refused=big.count(2), hi=fake.fake_used(0))
""", LIMIT | {"FAKE_CUDA_MEM_MB": "4096"})
    r = child.result
    assert r["small"] == 130 and r["ok"] == 49 and r["refused"] == 51, r
    assert r["hi"] <= 1000 * MiB, r
    assert "memory pools" not in child.stderr


def test_pools_beyond_the_bound_are_refused_with_one_warning(env: Env) -> None:
    child = env.run_py(POOLS + """
pools, rcs = [], []
for i in range(4096 + 30):
    pool = new_pool()
    pools.append(pool)
    rc, p = pool_alloc(pool, 4096)
    rcs.append(rc)
    if rc == 0:
        assert shim.cuMemFreeAsync(p, s[0]) == 0
for pool in pools[:10]:
    assert shim.cuMemPoolDestroy(pool) == 0
again = [pool_alloc(new_pool(), 4096)[0] for _ in range(10)]
emit(first=rcs[:4096].count(0), last=rcs[4096:], again=again)
""", LIMIT, timeout=120)
    r = child.result
    assert r["first"] == 4096, r
    assert r["last"] == [2] * 30, r                 # refused, never let through uncharged
    assert r["again"] == [0] * 10, r                # destroyed pools' slots are used again
    assert child.stderr.count("more than 4096 memory pools") == 1, child.stderr


STEPS = POOLS + """
def reserve_high(pool):
    v = ffi.new("unsigned long long *")
    assert shim.cuMemPoolGetAttribute(pool, 6, v) == 0    # CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH
    return v[0]
"""


def test_a_growth_step_that_does_not_fit_is_refused_before_the_pool_grows(env: Env) -> None:
    """A real pool grows in steps (32 MiB on an H200; the fake here too), so an allocation adds more to
    the reserve than it was short of. An allocation is charged the pool's growth for all of it, rounded
    up to the step: near the limit it is refused before the pool grows, so the device never holds more
    than the limit, not even for the moment an over-grown pool took to be undone."""
    r = env.run_py(STEPS + """
pool = new_pool()
rcs = [pool_alloc(pool, n * MiB)[0] for n in (10, 50, 10, 30)]
emit(rcs=rcs, real=fake.fake_used(0), high=reserve_high(pool), info=meminfo())
""", LIMIT | {"CUDA_DEVICE_MEMORY_LIMIT": "100m", "FAKE_CUDA_POOL_GRANULE_MB": "32"}).result
    # 10 -> reserve 32; 50 -> 64; 10 -> 96; 30 would take the reserve to 128 > 100
    assert r["rcs"] == [0, 0, 0, 2], r
    assert r["high"] == 96 * MiB, r                     # never grown past the limit (was 128, then undone)
    assert r["real"] <= 100 * MiB, r
    assert r["info"][1] == 100 * MiB - r["real"], r     # what is charged is what the device holds


def test_a_pools_first_growth_is_charged_a_step_before_the_pool_grows(env: Env) -> None:
    """Before any growth has shown the pool's step, the step pools grow by on current drivers (32 MiB) is
    charged: a first growth that does not fit is refused before the driver makes it."""
    r = env.run_py(STEPS + """
used = [alloc(80 * MiB)[0]]
pool = new_pool()
rc = pool_alloc(pool, 10 * MiB)[0]
emit(used=used, rc=rc, real=fake.fake_used(0), high=fake.fake_used_high(0), info=meminfo())
""", LIMIT | {"CUDA_DEVICE_MEMORY_LIMIT": "100m", "FAKE_CUDA_POOL_GRANULE_MB": "32"}).result
    assert r["used"] == [0] and r["rc"] == 2, r          # 80 + a 32 MiB step > 100
    assert r["high"] == 80 * MiB, r                     # the pool never grew (was 112, then undone)
    assert r["info"][1] == 100 * MiB - r["real"], r


def test_a_spare_the_driver_cannot_use_never_takes_the_pool_past_the_limit(env: Env) -> None:
    """A pool's spare may serve nothing: pieces smaller than the allocation, or memory freed on another
    stream and not reusable yet. The driver then grows the pool where the spare looked enough. Each
    allocation is insured for its whole growth, so that growth is never made past the limit; at the limit
    the pool's free steps are given back to make room (the reserve was 128 MiB under 100m, then undone)."""
    r = env.run_py(STEPS + """
pool = new_pool()
rcs = []
for i in range(8):
    rc, p = pool_alloc(pool, 10 * MiB)       # reserve 32, 64, 96; then trimmed to make room, and again
    rcs.append(rc)
    if rc == 0:
        assert shim.cuMemFreeAsync(p, s[0]) == 0
emit(rcs=rcs, high=fake.fake_used_high(0), info=meminfo(), real=fake.fake_used(0))
""", LIMIT | {"CUDA_DEVICE_MEMORY_LIMIT": "100m", "FAKE_CUDA_POOL_GRANULE_MB": "32",
              "FAKE_CUDA_POOL_SPARE_UNUSABLE": "1"}).result
    assert r["rcs"] == [0] * 8, r
    assert r["high"] <= 100 * MiB, r
    assert r["info"][1] == 100 * MiB - r["real"], r


def test_a_full_container_gives_back_the_pools_free_steps_to_make_room(env: Env) -> None:
    """At the limit, a pool's fully free steps are given back before an allocation is refused (the pool
    would keep them up to its release threshold): the allocation is then insured from what they held."""
    r = env.run_py(STEPS + """
pool = new_pool()
rc, p = pool_alloc(pool, 60 * MiB)           # reserve 64
assert rc == 0 and shim.cuMemFreeAsync(p, s[0]) == 0
held = alloc(30 * MiB)[0]                    # 94 of 100
rc = pool_alloc(pool, 20 * MiB)[0]           # a 32 MiB step does not fit beside 94: the free 64 go back
emit(held=held, rc=rc, reserve=fake.fake_used(0) - 30 * MiB, high=fake.fake_used_high(0), info=meminfo(),
     real=fake.fake_used(0))
""", LIMIT | {"CUDA_DEVICE_MEMORY_LIMIT": "100m", "FAKE_CUDA_POOL_GRANULE_MB": "32"}).result
    assert r["held"] == 0 and r["rc"] == 0, r
    assert r["reserve"] == 32 * MiB, r
    assert r["high"] <= 100 * MiB, r
    assert r["info"][1] == 100 * MiB - r["real"], r


def test_the_step_is_learnt_from_growths_that_overshoot(env: Env) -> None:
    """The step is never thought larger than it is: growths of 32 MiB steps teach 32 MiB, and with it an
    allocation that fits in one step beside what is held is still granted, right up to the limit."""
    r = env.run_py(STEPS + """
pool = new_pool()
first = [pool_alloc(pool, n * MiB)[0] for n in (1, 40)]   # 1 -> 32 (learns >= 32); 40: short 9 -> 64
ok, q = pool_alloc(pool, 32 * MiB)                        # short 32 -> one step: 96 of 100
emit(first=first, ok=ok, high=reserve_high(pool), info=meminfo())
""", LIMIT | {"CUDA_DEVICE_MEMORY_LIMIT": "100m", "FAKE_CUDA_POOL_GRANULE_MB": "32"}).result
    assert r["first"] == [0, 0] and r["ok"] == 0, r
    assert r["high"] == 96 * MiB, r
    assert r["info"][1] == 4 * MiB, r


def test_a_reading_while_a_pool_allocation_runs_counts_its_spare_as_maybe_trimmed(env: Env) -> None:
    """While an allocation from a pool runs, another thread may trim the pool's spare, and a reading cannot
    settle that pool (the allocation holds it). Taken as held, the spare trimmed made the context's memory
    look like less overhead: it was dropped, and found short once the allocation settled the pool."""
    r = env.run_py(POOLS + """
import time
pool = new_pool()
rc, p = pool_alloc(pool, 200 * MiB)
assert rc == 0 and shim.cuMemFreeAsync(p, s[0]) == 0     # the pool keeps 200 MiB spare
got = {}
def grow():
    ctx_on(0)
    got["rc"] = pool_alloc(pool, 10 * MiB)[0]           # 300 ms in the driver
t = threading.Thread(target=grow)
t.start()
time.sleep(0.05)
assert shim.cuMemPoolTrimTo(pool, 0) == 0              # the spare goes back meanwhile
near = alloc(70 * MiB)[0]                              # near the limit: a reading while the pool allocation runs
t.join()
more = alloc(250 * MiB)[0]                             # far from the limit by what is charged: no reading
emit(rc=got["rc"], near=near, more=more, high=fake.fake_used_high(0), after=meminfo(), real=fake.fake_used(0))
""", {"CUDA_DEVICE_MEMORY_LIMIT": "400m", "FAKE_CUDA_CTX_MB": "100", "FAKE_CUDA_ALLOC_DELAY_MS": "300"}).result
    assert r["rc"] == 0 and r["near"] == 0 and r["more"] == 2, r
    assert r["high"] <= 400 * MiB, r                  # was 430: the context's 100 MiB went uncounted
    assert r["after"][1] == 400 * MiB - r["real"], r  # what is charged is what the device holds
