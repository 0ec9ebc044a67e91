"""CUDA_VISIBLE_DEVICES subsets and orders (HAMi-core #319: usage written under the NVML index and checked
under the CUDA ordinal, so the limit was not enforced): with 4 devices and visible sets `2,3`, `3,1`, full
UUIDs and UUID prefixes, each CUDA ordinal's limit holds, its usage lands in the region under that ordinal,
and NVML (what nvidia-smi asks) reports the container's figures on the physical device that ordinal is and
the real figures on the devices the container does not see. The fake driver reads CUDA_VISIBLE_DEVICES as
the real one does (tests/fake_driver/visible.h); the shim never parses it (it matches devices by UUID)."""
from __future__ import annotations

import pytest

from .harness import Env

MiB = 1 << 20
PHYS_MB = 1024


def uuid(p: int) -> str:
    """The fake's UUID of physical device p (tests/fake_driver/visible.h)."""
    b = [0xfa, 0x4e, 0x00, p, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, p]
    h = "".join(f"{x:02x}" for x in b)
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


BODY = """
    def nvml(i):
        h = ffi.new("nvmlDevice_t *")
        assert shim.nvmlDeviceGetHandleByIndex_v2(i, h) == 0
        m = ffi.new("nvmlMemory_t *")
        assert shim.nvmlDeviceGetMemoryInfo(h[0], m) == 0
        m2 = ffi.new("nvmlMemory_v2_t *")
        m2.version = (2 << 24) | ffi.sizeof("nvmlMemory_v2_t")
        assert shim.nvmlDeviceGetMemoryInfo_v2(h[0], m2) == 0
        assert (m2.total, m2.used, m2.free) == (m.total, m.used, m.free), (i, m2.total, m.total)
        return [m.total // MiB, m.used // MiB, m.free // MiB]
    assert shim.nvmlInit_v2() == 0
    n = ffi.new("int *")
    assert shim.cuInit(0) == 0 and shim.cuDeviceGetCount(n) == 0
    rcs = []
    for d in range(n[0]):
        ctx_on(d)
        rcs.append([alloc(40 * MiB)[0], alloc(40 * MiB)[0], alloc(40 * MiB)[0]])
    infos = []
    for d in range(n[0]):
        ctx_on(d)
        rc, free, total = meminfo()
        infos.append([rc, total // MiB, free // MiB])
    from vgpu_patch.shim import region as R
    reg = R.read_region(os.environ["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    emit(count=n[0], rcs=rcs, info=infos, nvml=[nvml(i) for i in range(4)], uuids=reg.uuids[:2],
         limit=reg.limit[:2], used=[reg.used(d) // MiB for d in range(4)])
"""

# ordinal 0 gets 64m (one 40 MiB allocation fits), ordinal 1 gets 100m (two fit)
LIMITS = {"CUDA_DEVICE_MEMORY_LIMIT_0": "64m", "CUDA_DEVICE_MEMORY_LIMIT_1": "100m",
          "FAKE_CUDA_DEVICES": "4", "FAKE_CUDA_PHYSICAL_DEVICES": "4", "FAKE_CUDA_MEM_MB": str(PHYS_MB)}

VISIBLE = {
    "indices 2,3": ("2,3", [2, 3]),
    "reordered 3,1": ("3,1", [3, 1]),
    "full UUIDs": (f"{uuid(3)},{uuid(0)}", [3, 0]),
    "UUID prefixes": (f"{uuid(1)[:12]},{uuid(2)[:12]}", [1, 2]),
    "spaces and a bad tail": (" 2 , 0 ,7,1", [2, 0]),  # the driver stops at the first entry naming no device
}


@pytest.mark.parametrize("case", sorted(VISIBLE))
def test_each_ordinal_holds_its_limit_on_its_own_physical_device(env: Env, case: str) -> None:
    visible, phys = VISIBLE[case]
    cache = env.tmp / f"region-{case.replace(' ', '-')}"
    r = env.run_py(BODY, {**LIMITS, "CUDA_VISIBLE_DEVICES": visible,
                          "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cache)}).result
    assert r["count"] == 2
    assert r["rcs"] == [[0, 2, 2], [0, 0, 2]], r  # 64m: one 40 MiB fits; 100m: two
    assert r["info"] == [[0, 64, 24], [0, 100, 20]], r
    want = [[PHYS_MB, 0, PHYS_MB] for _ in range(4)]
    want[phys[0]] = [64, 40, 24]
    want[phys[1]] = [100, 80, 20]
    assert r["nvml"] == want, r
    # the region holds each ordinal's usage under that ordinal, with that device's UUID (what the monitor reads)
    assert r["uuids"] == [uuid(p) for p in phys] and r["limit"] == [64 * MiB, 100 * MiB], r
    assert r["used"] == [40, 80, 0, 0], r
