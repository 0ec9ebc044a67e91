"""The limit is what the GPU really gives the container, read from NVML by this test process, which
does not preload the shim (run on the H200: `pytest tests/gpu --gpu -s`).

Each workload fills a 4g limit until it is refused, then holds what it has while this process reads
its real usage (context, modules, allocations, pool reserves) from NVML; that figure must not exceed
the limit. Real CUDA runtimes come from pip wheels: point VGPU_TEST_CUDART at them, e.g.
`VGPU_TEST_CUDART=/tmp/cu11/nvidia/cuda_runtime/lib/libcudart.so.11.0:/tmp/cu12/.../libcudart.so.12`;
the toolkit's own runtime is added when found. The table printed goes into docs/benchmarks.md.
"""
from __future__ import annotations

import ctypes
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import Gpu

pytestmark = pytest.mark.gpu

MiB = 1 << 20
GiB = 1 << 30
LIMIT = 4 * GiB
HERE = Path(__file__).resolve().parent


class _Proc(ctypes.Structure):  # nvmlProcessInfo_t (v2 layout, also what _v3 fills)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]


class Truth:
    """NVML in this process (no shim): what the driver really holds for a pid."""

    def __init__(self) -> None:
        self.nv = ctypes.CDLL("libnvidia-ml.so.1")
        assert self.nv.nvmlInit_v2() == 0
        self.dev = ctypes.c_void_p()
        assert self.nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.dev)) == 0

    def used(self, pids: set[int]) -> int:
        return sum(self.each(pids).values())

    def each(self, pids: set[int]) -> dict[int, int]:
        """bytes by pid, for those of pids that NVML lists"""
        n = ctypes.c_uint(256)
        procs = (_Proc * 256)()
        assert self.nv.nvmlDeviceGetComputeRunningProcesses_v3(self.dev, ctypes.byref(n), procs) == 0
        return {procs[i].pid: procs[i].usedGpuMemory for i in range(n.value) if procs[i].pid in pids}


@pytest.fixture(scope="module")
def truth() -> Truth:
    return Truth()


def hold(gpu: Gpu, argv: list[str], env: dict[str, str], truth: Truth, timeout: float = 240) -> dict:
    """Start a workload, wait for its READY line (it has filled the limit), read NVML, let it go."""
    p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        deadline = time.monotonic() + timeout
        ready = None
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            if line.startswith("READY "):
                ready = json.loads(line[6:])
                break
        assert ready is not None, f"{argv[:3]} never got ready: rc={p.poll()} {p.stderr.read()[-3000:]}"
        time.sleep(0.5)
        ready["real"] = truth.used({p.pid})
        p.stdin.write("go\n")
        p.stdin.flush()
        p.wait(timeout=60)
        return ready
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


CUDART = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    void *h = dlopen(argv[1], RTLD_NOW);
    int (*mem_info)(size_t *, size_t *), (*malloc_)(void **, size_t), (*version)(int *);
    size_t f = 0, t = 0, chunk = (size_t)256 << 20, got = 0;
    void *p;
    int v = 0, first_rc = 0;
    char line[16];

    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 2; }
    mem_info = (int (*)(size_t *, size_t *))dlsym(h, "cudaMemGetInfo");
    malloc_ = (int (*)(void **, size_t))dlsym(h, "cudaMalloc");
    version = (int (*)(int *))dlsym(h, "cudaRuntimeGetVersion");
    version(&v);
    first_rc = mem_info(&f, &t);
    while (malloc_(&p, chunk) == 0)
        got += chunk;
    printf("READY {\"runtime\": %d, \"info_rc\": %d, \"total\": %zu, \"free_at_start\": %zu, \"allocated\": %zu}\n",
           v, first_rc, t, f, got);
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 0;
    return 0;
}
"""


def cudarts() -> list[str]:
    found = [p for p in os.environ.get("VGPU_TEST_CUDART", "").split(":") if p]
    for pattern in ("/usr/local/cuda/lib64/libcudart.so.1[3-9]", "/usr/local/cuda/lib64/libcudart.so.1[3-9].*"):
        found += sorted(glob.glob(pattern))[:1]
    return found


@pytest.fixture(scope="module")
def cudart_prog(gpu: Gpu) -> Path:
    src = gpu.tmp / "cudart_fill.c"
    src.write_text(CUDART)
    out = gpu.tmp / "cudart_fill"
    subprocess.run(["gcc", "-O1", str(src), "-o", str(out), "-ldl"], check=True)
    return out


ROWS: list[tuple[str, dict]] = []


def record(name: str, r: dict) -> None:
    ROWS.append((name, r))
    print(f"\nPHYSICAL {name}: {json.dumps(r)}")


@pytest.mark.parametrize("lib", cudarts() or ["none"])
def test_cuda_runtimes_hold_the_limit(gpu: Gpu, cudart_prog: Path, truth: Truth, lib: str) -> None:
    if lib == "none":
        pytest.skip("no CUDA runtime found: set VGPU_TEST_CUDART")
    r = hold(gpu, [str(cudart_prog), lib], gpu.env("4g"), truth)
    record(f"cudart {r['runtime']}", r)
    assert r["info_rc"] == 0 and r["total"] == LIMIT, r   # every runtime sees the limit, never the device
    assert r["free_at_start"] < LIMIT                     # the context is already counted
    assert r["real"] <= LIMIT, r


TORCH = """
import ctypes, json, os, sys, torch
torch.cuda.init()
free0, total = torch.cuda.mem_get_info()
kept = []
mode = sys.argv[1]
if mode == "async-then-sync":
    x = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
    del x                                   # the async pool keeps the 3 GiB reserved
    torch.cuda.synchronize()
    cu = ctypes.CDLL("libcuda.so.1")
    p = ctypes.c_uint64()
    extra = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(3 << 30))
else:
    extra = None
while True:
    try:
        kept.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        break
print("READY " + json.dumps({"total": total, "free_at_start": free0, "allocated": len(kept) * (256 << 20),
                             "sync_alloc_rc": extra}), flush=True)
sys.stdin.readline()
"""


def _need(gpu: Gpu, module: str) -> None:
    p = gpu.python(f"import {module}", None, preload=False)
    if p.returncode:
        pytest.skip(f"{module} is not installed on this host")


@pytest.mark.parametrize(("alloc_conf", "mode"), [
    ("", "fill"), ("expandable_segments:True", "fill"), ("backend:cudaMallocAsync", "fill"),
    ("backend:cudaMallocAsync", "async-then-sync"),
])
def test_pytorch_allocators_hold_the_limit(gpu: Gpu, truth: Truth, alloc_conf: str, mode: str) -> None:
    _need(gpu, "torch")
    env = gpu.env("4g", PYTORCH_CUDA_ALLOC_CONF=alloc_conf) if alloc_conf else gpu.env("4g")
    r = hold(gpu, [sys.executable, "-c", TORCH, mode], env, truth)
    record(f"torch {alloc_conf or 'default'} {mode}", r)
    assert r["total"] == LIMIT
    if mode == "async-then-sync":
        assert r["sync_alloc_rc"] == 2, r                 # the pool still holds the 3 GiB: refused
    assert r["real"] <= LIMIT, r


CUPY = """
import json, sys, cupy
if sys.argv[1] == "async":
    cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
free0, total = cupy.cuda.runtime.memGetInfo()
kept = []
while True:
    try:
        kept.append(cupy.empty(256 << 20, dtype=cupy.uint8))
    except cupy.cuda.memory.OutOfMemoryError:
        break
print("READY " + json.dumps({"total": total, "free_at_start": free0, "allocated": len(kept) * (256 << 20)}), flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("pool", ["default", "async"])
def test_cupy_holds_the_limit(gpu: Gpu, truth: Truth, pool: str) -> None:
    _need(gpu, "cupy")
    r = hold(gpu, [sys.executable, "-c", CUPY, pool], gpu.env("4g"), truth)
    record(f"cupy {pool} pool", r)
    assert r["total"] == LIMIT and r["real"] <= LIMIT, r


JAX = """
import json, sys
import jax, jax.numpy as jnp
dev = jax.devices()[0]
stats = dev.memory_stats() or {}
kept = []
while True:
    try:
        a = jnp.zeros((256 << 20,), dtype=jnp.uint8)
        a.block_until_ready()
        kept.append(a)
    except Exception:  # XlaRuntimeError RESOURCE_EXHAUSTED
        break
print("READY " + json.dumps({"total": stats.get("bytes_limit"), "allocated": len(kept) * (256 << 20)}), flush=True)
sys.stdin.readline()
"""


def test_jax_holds_the_limit(gpu: Gpu, truth: Truth) -> None:
    _need(gpu, "jax")
    r = hold(gpu, [sys.executable, "-c", JAX], gpu.env("4g"), truth)
    record("jax (preallocating)", r)
    assert r["real"] <= LIMIT, r


def test_two_processes_share_one_limit(gpu: Gpu, cudart_prog: Path, truth: Truth) -> None:
    """Two processes, one region: their contexts and allocations together stay under 4g."""
    libs = cudarts()
    if not libs:
        pytest.skip("no CUDA runtime found")
    env = gpu.env("4g")
    procs = []
    try:
        for _ in range(2):
            p = subprocess.Popen([str(cudart_prog), libs[-1]], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            line = p.stdout.readline()
            assert line.startswith("READY "), p.stderr.read()
            procs.append((p, json.loads(line[6:])))
        real = truth.used({p.pid for p, _ in procs})
        record("two processes, one 4g region", {"real": real, "allocated": [r["allocated"] for _, r in procs]})
        assert real <= LIMIT
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.stdin.write("go\n")
                p.stdin.flush()
                p.wait(timeout=30)


STREAMS = r"""
#include <cuda.h>
#include <stdio.h>

int main(void)
{
    CUdevice d;
    CUcontext c;
    CUdeviceptr p;
    CUstream s;
    size_t got = 0, chunk;
    int made = 0, refused = 0, i;
    char line[16];

    if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c))
        return 2;
    for (i = 0; i < 64; i++) /* 2 MiB of driver memory for every four on an H200 */
        made += cuStreamCreate(&s, 0) == CUDA_SUCCESS;
    for (chunk = (size_t)64 << 20; chunk >= ((size_t)2 << 20); chunk /= 2)
        while (cuMemAlloc(&p, chunk) == CUDA_SUCCESS)
            got += chunk;
    for (i = 0; i < 8; i++) /* in a full container: a stream that may need a piece is refused */
        refused += cuStreamCreate(&s, 0) == CUDA_ERROR_OUT_OF_MEMORY;
    printf("READY {\"streams\": %d, \"allocated\": %zu, \"refused_when_full\": %d}\n", made, got, refused);
    fflush(stdout);
    return fgets(line, sizeof line, stdin) ? 0 : 0;
}
"""


def test_streams_driver_memory_holds_the_limit(gpu: Gpu, truth: Truth) -> None:
    """64 streams take 32 MiB of driver memory outside any allocation (H200, driver 580); the container's limit
    holds it: each stream is charged a stand-in first and what it took measured after."""
    from vgpu_patch.shim_build.build import header_dir

    src, exe = gpu.tmp / "streams.c", gpu.tmp / "streams"
    src.write_text(STREAMS)
    subprocess.run(["gcc", "-O1", f"-I{header_dir()}", str(src), "-o", str(exe), "-l:libcuda.so.1"], check=True)
    r = hold(gpu, [str(exe)], gpu.env("4g"), truth)
    record("64 streams, then cuMemAlloc", r)
    assert r["streams"] == 64 and r["refused_when_full"] > 0, r
    assert r["real"] <= LIMIT, r


def test_reports_agree(gpu: Gpu) -> None:
    """cuMemGetInfo, cuDeviceTotalMem, NVML and nvidia-smi inside the container tell one story."""
    r = gpu.probe_run("limit", "4g")
    smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits"],
                         env=gpu.env("4g"), capture_output=True, text=True, timeout=60)
    record("reports", {"probe": {k: r[k] for k in ("info_total", "device_total")}, "nvidia-smi": smi.stdout.strip()})
    assert int(r["info_total"]) == int(r["device_total"]) == LIMIT
    if smi.returncode == 0:
        assert smi.stdout.split(",")[0].strip() == "4096"


def test_zz_print_table() -> None:
    """The table for docs/benchmarks.md (MiB, host NVML)."""
    if not ROWS:
        pytest.skip("nothing measured")
    print("\n| workload under 4g | real (host NVML) | allocated | total shown |")
    print("|---|---|---|---|")
    for name, r in ROWS:
        real, alloc, total = (r.get(k) for k in ("real", "allocated", "total"))
        mib = [v // MiB if isinstance(v, int) else v for v in (real, alloc, total)]
        print(f"| {name} | {mib[0]} MiB | {mib[1]} | {mib[2]} |")
