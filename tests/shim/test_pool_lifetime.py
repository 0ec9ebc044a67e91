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
s = ffi.new("CUstream *"); assert shim.cuStreamCreate(s, 0) == 0
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
    the reserve than it was short of. Once a growth has shown the step, a shortfall is charged rounded up
    to it: near the limit the allocation is refused before the pool grows, so the device never holds
    more than the limit, not even for the moment an over-grown pool took to be undone."""
    r = env.run_py(STEPS + """
pool = new_pool()
rcs = [pool_alloc(pool, n * MiB)[0] for n in (10, 70, 10, 10)]
emit(rcs=rcs, real=fake.fake_used(0), high=reserve_high(pool), info=meminfo())
""", LIMIT | {"CUDA_DEVICE_MEMORY_LIMIT": "100m", "FAKE_CUDA_POOL_GRANULE_MB": "32"}).result
    # 10 -> reserve 32 (the step: 32 MiB); 70 -> 96; 10 from the spare; 10 would take the reserve to 128 > 100
    assert r["rcs"] == [0, 0, 0, 2], r
    assert r["high"] == 96 * MiB, r                     # never grown past the limit (was 128, then undone)
    assert r["real"] <= 100 * MiB, r
    assert r["info"][1] == 100 * MiB - r["real"], r     # what is charged is what the device holds


def test_a_pools_first_growth_past_the_limit_is_undone(env: Env) -> None:
    """Before any growth has shown the step, the shortfall is charged as it is; a growth past the limit
    is freed, the pool trimmed back and the caller refused; the charge and the device agree again."""
    r = env.run_py(STEPS + """
used = [alloc(80 * MiB)[0]]
pool = new_pool()
rc = pool_alloc(pool, 10 * MiB)[0]
emit(used=used, rc=rc, real=fake.fake_used(0), reserved=fake.fake_used(0) - 80 * MiB, info=meminfo())
""", LIMIT | {"CUDA_DEVICE_MEMORY_LIMIT": "100m", "FAKE_CUDA_POOL_GRANULE_MB": "32"}).result
    assert r["used"] == [0] and r["rc"] == 2, r          # 80 + a 32 MiB step > 100
    assert r["reserved"] == 0, r                        # trimmed back
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
