"""NVML's process listing on the real driver (issue 35): two processes of two containers (two regions) hold a
context at once; with a limit each one's compute listing, taken by dlsym as pynvml does (ctypes), shows its own
record only, through `_v2` (exported) and `_v3` (not exported, handed out by dlsym); without a limit each sees
both. A record is told apart by its memory (the second process holds 1 GiB more), since NVML names host pids,
which are not the test's own when it runs in a container. tests/shim/test_process_listing.py holds the same
over the fake driver in CI."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import Gpu

pytestmark = pytest.mark.gpu

CHILD = r"""
import ctypes, json, sys

class Info(ctypes.Structure):  # nvmlProcessInfo_v2_t = nvmlProcessInfo_t (the _v3 record)
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]

cuda = ctypes.CDLL("libcuda.so.1")
ctx, ptr, dev = ctypes.c_void_p(), ctypes.c_ulonglong(), ctypes.c_int()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(int(sys.argv[1]) << 20)) == 0
nvml = ctypes.CDLL("libnvidia-ml.so.1")
h = ctypes.c_void_p()
assert nvml.nvmlInit_v2() == 0 and nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
print("ready", flush=True)
sys.stdin.readline()  # both processes hold their context now
out = {}
for name in ("nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses_v3"):
    fn, n = getattr(nvml, name), ctypes.c_uint(0)  # ctypes' attribute lookup is dlsym(handle, name)
    fn(h, ctypes.byref(n), None)
    room = ctypes.c_uint(n.value + 8)
    infos = (Info * room.value)()
    rc = fn(h, ctypes.byref(room), infos)
    out[name] = [rc, sorted([infos[i].pid, infos[i].used >> 20] for i in range(room.value))]
print(json.dumps(out), flush=True)
sys.stdin.readline()  # the other one has listed too
"""


NAMES = ("nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses_v3")


@pytest.mark.parametrize("limit", ["4g", None])
def test_each_container_lists_only_its_own_process(gpu: Gpu, limit: str | None) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, mib], env=gpu.env(limit), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for mib in ("64", "1088")]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", "child failed to start"
        results = []
        for p in procs:  # one after the other, the other still holding its context
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write("go\n")
            p.stdin.flush()
            results.append(json.loads(p.stdout.readline()))
        pids = [[[pid for pid, _ in r[n][1]] for n in NAMES] for r in results]
        for r, (v2, v3) in zip(results, pids):
            assert [r[n][0] for n in NAMES] == [0, 0] and v2 == v3, r  # _v3 answers as _v2 does
        small, big = (r[NAMES[1]][1] for r in results)
        if limit:  # each its own record only: the other's pid is absent, and its own holds 1 GiB less or more
            assert len(small) == len(big) == 1 and small[0][0] != big[0][0], results
            assert big[0][1] - small[0][1] >= 900, results
        else:  # the driver's answer: both are there
            assert pids[0] == pids[1] and len(small) >= 2, results
    finally:
        for p in procs:
            _, err = p.communicate(input="done\n", timeout=60)
            assert p.returncode == 0, err
