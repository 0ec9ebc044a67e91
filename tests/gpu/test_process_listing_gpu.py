"""NVML's process listing on the real driver (issue 35): two processes of two containers (two regions) hold a
context at once; with a limit each one's compute listing, taken by dlsym as pynvml does (ctypes), shows its own
pid only, through `_v2` (exported) and `_v3` (not exported, handed out by dlsym); without a limit each sees both.
tests/shim/test_process_listing.py holds the same over the fake driver in CI."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import Gpu

pytestmark = pytest.mark.gpu

CHILD = r"""
import ctypes, json, os, sys

class Info(ctypes.Structure):  # nvmlProcessInfo_v2_t = nvmlProcessInfo_t (the _v3 record)
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]

cuda = ctypes.CDLL("libcuda.so.1")
ctx, ptr, dev = ctypes.c_void_p(), ctypes.c_ulonglong(), ctypes.c_int()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(64 << 20)) == 0
nvml = ctypes.CDLL("libnvidia-ml.so.1")
h = ctypes.c_void_p()
assert nvml.nvmlInit_v2() == 0 and nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
print("ready", flush=True)
sys.stdin.readline()  # both processes hold their context now
out = {"pid": os.getpid()}
for name in ("nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses_v3"):
    fn, n = getattr(nvml, name), ctypes.c_uint(0)  # ctypes' attribute lookup is dlsym(handle, name)
    fn(h, ctypes.byref(n), None)
    room = ctypes.c_uint(n.value + 8)
    infos = (Info * room.value)()
    rc = fn(h, ctypes.byref(room), infos)
    out[name] = [rc, sorted(infos[i].pid for i in range(room.value))]
print(json.dumps(out), flush=True)
sys.stdin.readline()  # the other one has listed too
"""


@pytest.mark.parametrize("limit", ["2g", None])
def test_each_container_lists_only_its_own_process(gpu: Gpu, limit: str | None) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", CHILD], env=gpu.env(limit), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", "child failed to start"
        results = []
        for p in procs:  # one after the other, the other still holding its context
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write("go\n")
            p.stdin.flush()
            results.append(json.loads(p.stdout.readline()))
        pids = {r["pid"] for r in results}
        for r in results:
            for name in ("nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses_v3"):
                rc, listed = r[name]
                assert rc == 0, (name, r)
                if limit:
                    assert listed == [r["pid"]], (name, r)  # its own record only
                else:
                    assert pids <= set(listed), (name, r)  # the driver's answer: both are there
    finally:
        for p in procs:
            _, err = p.communicate(input="done\n", timeout=60)
            assert p.returncode == 0, err
