"""The shim over the real driver (run on a GPU host with `pytest tests/gpu --gpu`; skipped in CI)."""
from __future__ import annotations

import pytest

from .conftest import Gpu

pytestmark = pytest.mark.gpu

GiB = 1 << 30
MiB = 1 << 20


def test_driver_api_4g_limit(gpu: Gpu) -> None:
    r = gpu.probe_run("limit", "4g")
    assert r["init_rc"] == "0"
    assert int(r["info_total"]) == 4 * GiB and int(r["device_total"]) == 4 * GiB
    # the context's own memory (about 518 MiB on an H200) is counted before any allocation
    ctx = 4 * GiB - int(r["info_free"])
    assert 64 * MiB < ctx < 2 * GiB, r
    assert int(r["allocated_512m"]) == int(r["info_free"]) // (512 * MiB), r  # then refused, never past 4 GiB
    assert r["refused_rc"] == "2"  # CUDA_ERROR_OUT_OF_MEMORY
    assert int(r["full_free"]) < 512 * MiB
    assert int(r["freed_free"]) == int(r["info_free"])


def test_zero_limit_shows_the_full_device(gpu: Gpu) -> None:
    r = gpu.probe_run("limit", "0m")
    assert int(r["info_total"]) > 16 * GiB and int(r["device_total"]) == int(r["info_total"])
    assert int(r["allocated_512m"]) > 8


def test_vmm_on_contextless_thread(gpu: Gpu) -> None:
    r = gpu.probe_run("vmm", "4g")
    assert r["thread_ctx_rc"] == "201"  # the thread really has no context
    assert (r["gran_rc"], r["create_rc"], r["reserve_rc"], r["map_rc"], r["access_rc"]) == ("0",) * 5
    assert r["create_over_rc"] == "2"
    assert (r["unmap_rc"], r["release_rc"]) == ("0", "0")
    assert r["numa_create_rc"].lstrip("-").isdigit(), r  # host NUMA: supported or not, never a crash
    assert int(r["after_total"]) == 4 * GiB


def test_stream_ordered_on_contextless_thread(gpu: Gpu) -> None:
    r = gpu.probe_run("async", "4g")
    assert r["thread_ctx_rc"] == "201"
    assert (r["async_rc"], r["async_over_rc"], r["free_async_rc"], r["sync_rc"], r["async_again_rc"]) == (
        "0", "2", "0", "0", "0")


def test_a_pool_never_grows_past_the_limit(gpu: Gpu) -> None:
    """The driver grows a pool in steps (32 MiB on an H200): once a growth has shown the step, an allocation
    whose step does not fit is refused before the pool grows, so its reserve never went past what it holds
    at the end (a growth past the limit would be undone, leaving the highest reserve above it)."""
    r = gpu.probe_run("steps", "2g")
    assert r["steps_refused_rc"] == "2", r
    assert int(r["steps_allocated"]) > 50, r               # the limit, not something else, stopped it
    assert r["pool_reserved_high"] == r["pool_reserved"], r
    assert int(r["steps_free"]) < 32 << 20, r               # refused only when a step did not fit


def test_runtime_path_through_get_proc_address(gpu: Gpu) -> None:
    """What cudart (and so PyTorch) does: all entry points from cuGetProcAddress_v2, per-thread flags."""
    r = gpu.probe_run("gpa", "4g")
    assert r["launch_in_shim"] == "1" and r["async_in_shim"] == "1"
    assert int(r["gpa_total"]) == 4 * GiB
    assert r["gpa_allocated_1g"] == "3" and r["gpa_refused_rc"] == "2"  # the context takes part of the 4th
    assert r["gpa_async_over_rc"] == "2"


TORCH_LIMIT = """
import json, torch
free, total = torch.cuda.mem_get_info()
try:
    x = torch.empty(6 * (1 << 30), dtype=torch.uint8, device="cuda")
    oom = False
except torch.OutOfMemoryError:
    oom = True
y = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")  # 1 GiB still fits
print(json.dumps({"free": free, "total": total, "oom": oom, "small_ok": y.numel() == 1 << 30}))
"""


def _torch_or_skip(gpu: Gpu) -> None:
    p = gpu.python("import torch; assert torch.cuda.is_available()", None, preload=False)
    if p.returncode:
        pytest.skip("PyTorch with CUDA is not installed on this host")


def test_pytorch_4g_limit(gpu: Gpu) -> None:
    import json
    _torch_or_skip(gpu)
    p = gpu.python(TORCH_LIMIT, "4g")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["total"] == 4 * GiB and r["free"] <= 4 * GiB
    assert r["oom"] is True and r["small_ok"] is True


def test_pytorch_zero_limit_full_device(gpu: Gpu) -> None:
    import json
    _torch_or_skip(gpu)
    p = gpu.python("import json, torch; print(json.dumps(torch.cuda.mem_get_info()))", "0m")
    bare = gpu.python("import json, torch; print(json.dumps(torch.cuda.mem_get_info()))", None, preload=False)
    assert p.returncode == 0 and bare.returncode == 0, p.stderr + bare.stderr
    assert json.loads(p.stdout.splitlines()[-1])[1] == json.loads(bare.stdout.splitlines()[-1])[1]


def test_nvidia_smi_style_nvml(gpu: Gpu) -> None:
    code = """
import ctypes, json
nv = ctypes.CDLL("libnvidia-ml.so.1")
class M(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
assert nv.nvmlInit_v2() == 0
h = ctypes.c_void_p()
assert nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
m = M()
print(json.dumps([nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)), m.total]))
"""
    p = gpu.python(code, "4g")
    assert p.returncode == 0, p.stderr
    import json
    assert json.loads(p.stdout.splitlines()[-1]) == [0, 4 * GiB]
