"""Figures that agree (HAMi's most reported class: ~14 threads of `nvidia-smi` and the framework disagreeing):
inside a limited container cuMemGetInfo, cuDeviceTotalMem, nvmlDeviceGetMemoryInfo and its v2 report one
total and one free, NVML's used is the container's usage, free never exceeds total, nothing is negative or
wrapped, in every state: a fresh context, part used, full, pushed over the limit by memory the driver took
behind every call (a module, local memory), after frees, and on a device smaller than the limit or shared
with another process of the container. Real processes over the fake driver."""
from __future__ import annotations

import pytest

from .harness import Env

MiB = 1 << 20
U64 = (1 << 64) - 1

BODY = """
    def figures(tag):
        rc, free, total = meminfo()
        assert rc == 0, (tag, rc)
        t = ffi.new("size_t *")
        assert shim.cuDeviceTotalMem_v2(t, 0) == 0
        h = ffi.new("nvmlDevice_t *")
        assert shim.nvmlDeviceGetHandleByIndex_v2(0, h) == 0
        m = ffi.new("nvmlMemory_t *")
        assert shim.nvmlDeviceGetMemoryInfo(h[0], m) == 0
        m2 = ffi.new("nvmlMemory_v2_t *")
        m2.version = (2 << 24) | ffi.sizeof("nvmlMemory_v2_t")
        assert shim.nvmlDeviceGetMemoryInfo_v2(h[0], m2) == 0
        return {"tag": tag, "cu": [total, free], "totalmem": t[0], "nvml": [m.total, m.used, m.free],
                "nvml2": [m2.total, m2.used, m2.free, m2.reserved]}
    assert shim.nvmlInit_v2() == 0 and shim.cuInit(0) == 0
    ctx_on(0)
    out = [figures("context")]
    ptrs = []
    for i in range(int(os.environ["T_ALLOCS"])):
        rc, p = alloc(20 * MiB)
        if rc == 0:
            ptrs.append(p)
    out.append(figures("allocated"))
    assert fake.fake_grow(0, int(os.environ["T_GROW_MB"]) * MiB) == 0
    import time
    time.sleep(0.05)  # a report measures again at most every 20 ms
    out.append(figures("grown"))
    for p in ptrs:
        assert shim.cuMemFree_v2(p) == 0
    out.append(figures("freed"))
    emit(states=out, allocs=len(ptrs))
"""

CASES = {
    # limit, physical MiB, context MiB, 20 MiB allocations tried, MiB the driver takes behind the calls
    "part used": ("100m", 1024, 8, 2, 0),
    "full": ("100m", 1024, 8, 10, 0),
    "over the limit": ("100m", 1024, 8, 4, 40),
    "device smaller than the limit": ("2g", 256, 8, 20, 0),
    "no limit": ("0", 1024, 8, 3, 0),
}


def _check(state: dict, limit: int, phys: int) -> None:
    total, free = state["cu"]
    n_total, n_used, n_free = state["nvml"]
    for v in (total, free, n_total, n_used, n_free, *state["nvml2"]):
        assert 0 <= v < (1 << 50), state  # nothing negative or wrapped
    assert free <= total, state
    assert total == state["totalmem"] == n_total == state["nvml2"][0], state  # one total
    assert free == n_free == state["nvml2"][2], state  # one free
    assert n_used == state["nvml2"][1], state
    if limit:
        assert total == limit and state["nvml2"][3] == 0, state
        # used is the container's usage: it and free make the total unless the device itself is short
        # (free is then the device's) or the driver took memory past the limit (used shows it, free is 0)
        if n_used >= limit:
            assert free == 0, state
        elif free < limit - n_used:
            assert free <= phys - n_used, state
        else:
            assert n_used + free == total, state
    else:
        assert total == phys, state


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_report_gives_one_total_and_one_free(env: Env, case: str) -> None:
    limit, phys, ctx, allocs, grow = CASES[case]
    r = env.run_py(BODY, {"CUDA_DEVICE_MEMORY_LIMIT": limit, "FAKE_CUDA_DEVICES": "1", "FAKE_CUDA_MEM_MB": str(phys),
                          "FAKE_CUDA_CTX_MB": str(ctx), "T_ALLOCS": str(allocs), "T_GROW_MB": str(grow)})
    assert r.rc == 0, r.stderr
    lim = {"100m": 100 * MiB, "2g": 2048 * MiB, "0": 0}[limit]
    for state in r.result["states"]:
        _check(state, lim, phys * MiB)
    states = {s["tag"]: s for s in r.result["states"]}
    if lim:
        assert states["context"]["nvml"][1] == ctx * MiB  # the context counts, as the host sees it
    if case == "over the limit":
        assert states["grown"]["nvml"][1] > lim and states["grown"]["cu"][1] == 0, states["grown"]
    if case == "full":
        assert r.result["allocs"] == 4 and states["allocated"]["cu"][1] == (100 - 8 - 80) * MiB


SHARED = """
    assert shim.cuInit(0) == 0
    ctx_on(0)
    ptrs = [alloc(int(os.environ["T_MB"]) * MiB) for _ in range(1)]
    assert all(rc == 0 for rc, _ in ptrs)
    rc, free, total = meminfo()
    h = ffi.new("nvmlDevice_t *")
    assert shim.nvmlInit_v2() == 0 and shim.nvmlDeviceGetHandleByIndex_v2(0, h) == 0
    m = ffi.new("nvmlMemory_t *")
    assert shim.nvmlDeviceGetMemoryInfo(h[0], m) == 0
    emit(cu=[total, free], nvml=[m.total, m.used, m.free])
    if os.environ.get("T_HOLD"):
        sys.stdin.readline()
"""


def test_two_processes_of_a_container_see_the_same_figures(env: Env) -> None:
    """The first process holds 30 MiB while the second takes 20: both see used 50 + two contexts."""
    import subprocess
    import sys

    from .harness import CDEF, PRELUDE

    cache = env.tmp / "shared.cache"
    base = {"CUDA_DEVICE_MEMORY_LIMIT": "100m", "FAKE_CUDA_DEVICES": "1", "FAKE_CUDA_CTX_MB": "4",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cache)}
    code = f"CDEF = {CDEF!r}\n" + PRELUDE + "\n" + "\n".join(ln[4:] for ln in SHARED.splitlines())
    first = subprocess.Popen([sys.executable, "-c", code], env=env.base_env({**base, "T_MB": "30", "T_HOLD": "1"}),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = first.stdout.readline() if first.stdout else ""
        assert line.startswith("RESULT "), first.stderr.read() if first.stderr else ""
        second = env.run_py(SHARED, {**base, "T_MB": "20"})
        assert second.rc == 0, second.stderr
        r = second.result
        assert r["nvml"] == [100 * MiB, 58 * MiB, 42 * MiB] and r["cu"] == [100 * MiB, 42 * MiB], r
    finally:
        try:
            first.communicate("\n", timeout=30)
        except subprocess.TimeoutExpired:
            first.kill()
            first.communicate()
