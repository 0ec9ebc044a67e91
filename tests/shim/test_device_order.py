"""NVML numbers devices as the host does, CUDA as CUDA_VISIBLE_DEVICES orders them: each device's
limit is reported on the physical GPU it belongs to, matched by UUID (the fake driver reorders
with FAKE_CUDA_ORDER; its NVML sees every physical device)."""
from __future__ import annotations

from .harness import Env

MiB = 1 << 20

BODY = """
    def nvml_total(i):
        h = ffi.new("nvmlDevice_t *")
        assert shim.nvmlDeviceGetHandleByIndex_v2(i, h) == 0
        m = ffi.new("nvmlMemory_t *")
        assert shim.nvmlDeviceGetMemoryInfo(h[0], m) == 0
        m2 = ffi.new("nvmlMemory_v2_t *")
        assert shim.nvmlDeviceGetMemoryInfo_v2(h[0], m2) == 0
        assert m2.total == m.total
        return m.total // MiB
    def cuda_total(d):
        t = ffi.new("size_t *")
        assert shim.cuDeviceTotalMem_v2(t, d) == 0
        return t[0] // MiB
    assert shim.nvmlInit_v2() == 0
    n = ffi.new("int *")
    assert shim.cuInit(0) == 0 and shim.cuDeviceGetCount(n) == 0
    emit(cuda=[cuda_total(d) for d in range(n[0])], nvml=[nvml_total(i) for i in range(int(os.environ["T_PHYS"]))])
"""


def test_reordered_devices_report_their_own_limit(env: Env) -> None:
    r = env.run_py(BODY, {"FAKE_CUDA_ORDER": "1,0", "T_PHYS": "2",
                          "CUDA_DEVICE_MEMORY_LIMIT_0": "64m", "CUDA_DEVICE_MEMORY_LIMIT_1": "128m"}).result
    assert r["cuda"] == [64, 128]   # CUDA ordinal 0 is physical GPU 1
    assert r["nvml"] == [128, 64]   # NVML index 0 is physical GPU 0, which is CUDA ordinal 1


def test_hidden_device_shows_no_limit_of_another(env: Env) -> None:
    r = env.run_py(BODY, {"FAKE_CUDA_ORDER": "1", "FAKE_CUDA_PHYSICAL_DEVICES": "2", "T_PHYS": "2",
                          "CUDA_DEVICE_MEMORY_LIMIT_0": "64m"}).result
    assert r["cuda"] == [64]
    assert r["nvml"] == [1024, 64]  # physical GPU 0 is not this container's CUDA device 0
