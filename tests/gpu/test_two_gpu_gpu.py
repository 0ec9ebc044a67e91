"""Two-GPU smoke over the real driver (HAMi PR #1947, #2760, #2641: vLLM tensor parallel across vGPUs needed
`--disable-custom-all-reduce` because CUDA IPC failed): a tensor-parallel NCCL all-reduce across two GPUs, a
CUDA tensor shared between two processes by CUDA IPC and peer copies, each process under a 4g limit per
device on one region (as HAMi gives a two-GPU pod). Run with `pytest tests/gpu --gpu` on a machine with two
GPUs and PyTorch with NCCL; skipped otherwise (and everywhere in CI)."""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from .conftest import Gpu

pytestmark = pytest.mark.gpu

GiB = 1 << 30


def _two_gpus_with_torch(gpu: Gpu) -> None:
    p = gpu.python("import torch, torch.distributed as d; assert torch.cuda.device_count() >= 2; "
                   "assert d.is_nccl_available()", None, preload=False)
    if p.returncode:
        pytest.skip("needs two GPUs and PyTorch with NCCL")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ALL_REDUCE = """
import json, os, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp

def worker(rank, port, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2)
    x = torch.full((64 << 20,), float(rank + 1), device=f"cuda:{rank}")   # 256 MiB each
    for _ in range(5):
        dist.all_reduce(x)
        x /= 3.0                                                              # stays 1 + 2 = 3, then 1
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info(rank)
    q.put({"rank": rank, "value": float(x[0].item()), "ok": bool(torch.all(x == x[0]).item()),
           "free": free, "total": total})
    dist.destroy_process_group()

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.spawn(worker, args=(int(sys.argv[1]), q), nprocs=2, join=True)
    print(json.dumps(sorted([q.get(), q.get()], key=lambda r: r["rank"])))
"""


def test_tensor_parallel_nccl_all_reduce_under_a_limit(gpu: Gpu, tmp_path) -> None:
    _two_gpus_with_torch(gpu)
    script = tmp_path / "all_reduce.py"
    script.write_text(ALL_REDUCE)
    env = gpu.env("4g", CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp_path / "pod.cache"), NCCL_DEBUG="WARN")
    p = subprocess.run([sys.executable, str(script), str(_port())], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    ranks = json.loads(p.stdout.strip().splitlines()[-1])
    for r in ranks:
        assert r["ok"] and abs(r["value"] - 1.0) < 1e-6, r
        assert r["total"] == 4 * GiB and 0 < r["free"] <= 4 * GiB - 256 * (1 << 20), r
    assert "vgpu:" not in p.stderr or "error" not in p.stderr.lower(), p.stderr[-4000:]


IPC = """
import json, sys
import torch, torch.multiprocessing as mp

def reader(q, out):
    t = q.get()                                   # opened here through cudaIpcOpenMemHandle
    free, total = torch.cuda.mem_get_info(0)
    peer = torch.cuda.can_device_access_peer(0, 1) if torch.cuda.device_count() > 1 else None
    copy = t.to("cuda:1").sum().item() if torch.cuda.device_count() > 1 else t.sum().item()
    out.put({"sum": float(t.sum().item()), "copy": float(copy), "free": free, "total": total, "peer": peer})
    q.put("done")

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q, out = ctx.Queue(), ctx.Queue()
    t = torch.ones(256 << 20, dtype=torch.uint8, device="cuda:0")   # 256 MiB, allocated here
    p = ctx.Process(target=reader, args=(q, out))
    p.start()
    q.put(t)
    r = out.get()
    q.get()
    free, total = torch.cuda.mem_get_info(0)
    p.join()
    r.update(writer_free=free)
    print(json.dumps(r))
"""


def test_cuda_ipc_between_two_processes_is_charged_once(gpu: Gpu, tmp_path) -> None:
    _two_gpus_with_torch(gpu)
    p = gpu.python(IPC, "4g")
    assert p.returncode == 0, p.stderr[-4000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["sum"] == float(256 << 20) and r["copy"] == r["sum"], r
    assert r["total"] == 4 * GiB, r
    # the reader's view counts the writer's 256 MiB once (and both contexts), not a second time for the opening
    assert r["free"] >= 4 * GiB - 256 * (1 << 20) - 2 * 1024 * (1 << 20), r
    assert r["peer"] in (True, False, None)


ORDER = """
import ctypes, json, os
cuda = ctypes.CDLL("libcuda.so.1")
nvml = ctypes.CDLL("libnvidia-ml.so.1")
class Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
assert cuda.cuInit(0) == 0 and nvml.nvmlInit_v2() == 0
n = ctypes.c_int()
cuda.cuDeviceGetCount(ctypes.byref(n))
totals = []
for d in range(n.value):
    ctx, t = ctypes.c_void_p(), ctypes.c_size_t()
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), d) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
    assert cuda.cuDeviceTotalMem_v2(ctypes.byref(t), d) == 0
    totals.append(t.value)
phys, uuids = [], []
count = ctypes.c_uint()
nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
for i in range(count.value):
    h, m, u = ctypes.c_void_p(), Mem(), ctypes.create_string_buffer(96)
    assert nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0
    assert nvml.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)) == 0
    nvml.nvmlDeviceGetUUID(h, u, 96)
    phys.append(m.total)
    uuids.append(u.value.decode())
print(json.dumps({"cuda": totals, "nvml": phys, "uuids": uuids}))
"""


def test_visible_device_orders_hold_each_limit_on_the_real_driver(gpu: Gpu) -> None:
    """HAMi-core #319 on real devices: reordered indices, full UUIDs and UUID prefixes."""
    _two_gpus_with_torch(gpu)
    base = gpu.python(ORDER, None, preload=False)
    assert base.returncode == 0, base.stderr
    uuids = json.loads(base.stdout.strip().splitlines()[-1])["uuids"]
    limits = {"CUDA_DEVICE_MEMORY_LIMIT_0": "2g", "CUDA_DEVICE_MEMORY_LIMIT_1": "3g"}
    for visible in ("1,0", f"{uuids[1]},{uuids[0]}", f"{uuids[1][:12]},{uuids[0][:12]}"):
        env = gpu.env(None, CUDA_VISIBLE_DEVICES=visible, **limits)
        p = subprocess.run([sys.executable, "-c", ORDER], env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, (visible, p.stderr)
        r = json.loads(p.stdout.strip().splitlines()[-1])
        assert r["cuda"] == [2 * GiB, 3 * GiB], (visible, r)
        # NVML numbers as the host: physical 1 is CUDA ordinal 0 (2g), physical 0 is ordinal 1 (3g)
        assert r["nvml"][:2] == [3 * GiB, 2 * GiB], (visible, r)
