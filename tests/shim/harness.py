"""Run shim scenarios in child processes: limits are read once per process, so each scenario
gets a fresh interpreter (or C program) with its own environment."""
from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from vgpu_patch.shim_build.build import header_dir

HEADERS = header_dir()

# Just enough of cuda.h / nvml.h for the scenarios (layouts as in the CUDA 13 headers).
CDEF = """
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUmemoryPool;
typedef void *CUarray;
typedef void *CUmipmappedArray;
typedef struct { int type; int id; } CUmemLocation;
typedef struct { int type; int requestedHandleTypes; CUmemLocation location; void *win32HandleMetaData;
                 unsigned char compressionType; unsigned char gpuDirectRDMACapable; unsigned short usage;
                 unsigned char reserved[4]; } CUmemAllocationProp;
typedef struct { int allocType; int handleTypes; CUmemLocation location; void *win32SecurityAttributes;
                 size_t maxSize; unsigned short usage; unsigned char reserved[64]; } CUmemPoolProps;
typedef struct { size_t Width; size_t Height; int Format; unsigned int NumChannels; } CUDA_ARRAY_DESCRIPTOR;
typedef struct { size_t Width; size_t Height; size_t Depth; int Format; unsigned int NumChannels;
                 unsigned int Flags; } CUDA_ARRAY3D_DESCRIPTOR;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef void *nvmlDevice_t;

CUresult cuInit(unsigned int);
CUresult cuDeviceGetCount(int *);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxGetDevice(CUdevice *);
CUresult cuCtxGetCacheConfig(void *);
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned int);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
CUresult cuMemPoolDestroy(CUmemoryPool);
CUresult cuMemPoolTrimTo(CUmemoryPool, size_t);
CUresult cuMemPoolGetAttribute(CUmemoryPool, int, void *);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *, CUdevice);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                        void **, void **);
CUresult cuLaunchKernel_ptsz(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuGetProcAddress(const char *, void **, int, unsigned long long);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
int nvmlInit_v2(void);
int nvmlDeviceGetHandleByIndex_v2(unsigned int, nvmlDevice_t *);
int nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvmlMemory_v2_t *);
int nvml_preInit(void);
unsigned long fake_calls(const char *);
unsigned long long fake_used(int);
unsigned long long fake_used_high(int);
int fake_grow(int, unsigned long long);
void *dlsym(void *, const char *);
"""

PRELUDE = """
import json, os, sys, threading
import cffi
ffi = cffi.FFI()
ffi.cdef(CDEF)
G = ffi.RTLD_NOW | ffi.RTLD_GLOBAL
fake = ffi.dlopen(os.environ["T_FAKE_CUDA"], G)   # the shim's dlopen("libcuda.so.1") finds it by SONAME
fakenvml = ffi.dlopen(os.environ["T_FAKE_NVML"], G)
shim = ffi.dlopen(os.environ["T_SHIM"])
MiB = 1 << 20
SUCCESS, INVALID_VALUE, OOM, NOT_FOUND, INVALID_CONTEXT, INVALID_DEVICE = 0, 1, 2, 500, 201, 101

def ctx_on(dev):
    # make device dev's primary context current on this thread
    c = ffi.new("CUcontext *")
    assert shim.cuDevicePrimaryCtxRetain(c, dev) == 0
    assert shim.cuCtxSetCurrent(c[0]) == 0
    return c[0]

def alloc(size):
    p = ffi.new("CUdeviceptr *")
    rc = shim.cuMemAlloc_v2(p, size)
    return rc, p[0]

def meminfo():
    f, t = ffi.new("size_t *"), ffi.new("size_t *")
    rc = shim.cuMemGetInfo_v2(f, t)
    return rc, f[0], t[0]

def emit(**kw):
    print("RESULT " + json.dumps(kw), flush=True)
"""


def region_defines() -> list[str]:
    """-D flags giving a C watcher the region's layout (vgpu_patch.shim.region): size, proc_num, slots, total, hold."""
    from vgpu_patch.shim import region as R

    used0 = R.SLOT_FIELDS["used"][0] + R.MEMORY_FIELDS["total"]
    hold0 = R.SLOT_FIELDS["device_util"][0] + R.UTIL_FIELDS["unused"]  # our exit hold (c_src/region/slots.c)
    return [f"-DREGION_SIZE={R.REGION_SIZE}", f"-DPROC_NUM_OFF={R.REGION_FIELDS['proc_num'][0]}",
            f"-DPROCS_OFF={R.REGION_FIELDS['procs'][0]}", f"-DSLOT_SIZE={R.SLOT_SIZE}",
            f"-DSTATUS_OFF={R.SLOT_FIELDS['status'][0]}", f"-DUSED0_OFF={used0}", f"-DHOLD0_OFF={hold0}"]


# C for a watcher of a mapped region (compile with region_defines()): the sum HAMi's monitor takes,
# used[0].total over live slots, lock-free; *procs gets proc_num when asked
REGION_SUM_C = r"""
#include <stddef.h>
#include <stdint.h>
static uint64_t region_sum(const unsigned char *r, int *procs)
{
    int n = __atomic_load_n((const int *)(r + PROC_NUM_OFF), __ATOMIC_RELAXED);
    uint64_t sum = 0;
    for (int i = 0; i < n && i < 1024; i++) {
        const unsigned char *s = r + PROCS_OFF + (size_t)i * SLOT_SIZE;
        if (__atomic_load_n((const int *)(s + STATUS_OFF), __ATOMIC_RELAXED))
            sum += __atomic_load_n((const uint64_t *)(s + USED0_OFF), __ATOMIC_RELAXED);
    }
    if (procs)
        *procs = n;
    return sum;
}
"""


# the initial pid namespace's proc inode (fixed by the kernel): outside it, NVML's host pids are not ours
INIT_PID_NAMESPACE = "pid:[4026531836]"


def in_init_pid_namespace() -> bool:
    """whether the tests run outside any pid namespace (no container): the shim then trusts NVML's pids"""
    try:
        return os.readlink("/proc/self/ns/pid") == INIT_PID_NAMESPACE
    except OSError:
        return False


@functools.cache
def pid_namespace_prefix() -> list[str] | None:
    """a command prefix that runs a program in a pid namespace of its own, as in a container: [] when the
    tests run in one already, None when none can be made here (no unshare, no privilege)"""
    if not in_init_pid_namespace():
        return []
    for prefix in (["unshare", "--pid", "--fork", "--kill-child"],
                   ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child"]):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0:
                return prefix
    return None


@dataclass
class Child:
    rc: int
    stdout: str
    stderr: str

    @property
    def result(self) -> dict:
        for line in reversed(self.stdout.splitlines()):
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
        raise AssertionError(f"child printed no RESULT (rc={self.rc})\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}")


@dataclass
class Env:
    shim: Path
    fake_dir: Path
    tmp: Path

    def base_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT", "FAKE_CUDA_", "LD_PRELOAD"))}
        env.update({
            "T_SHIM": str(self.shim),
            "T_FAKE_CUDA": str(self.fake_dir / "libcuda.so.1"),
            "T_FAKE_NVML": str(self.fake_dir / "libnvidia-ml.so.1"),
            # a private shared-region file per scenario (once budget.c is backed by the region)
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(self.tmp / f"cache-{os.urandom(6).hex()}"),
        })
        env.update(extra or {})
        return env

    def run_py(self, body: str, env: dict[str, str] | None = None, timeout: float = 60) -> Child:
        code = f"CDEF = {CDEF!r}\n" + PRELUDE + "\n" + textwrap.dedent(body)
        # its own process group: on a timeout the scenario's forked children go too, not only the parent
        with subprocess.Popen([sys.executable, "-c", code], env=self.base_env(env), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True) as p:
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                out, err = p.communicate()
                raise AssertionError(f"scenario timed out after {timeout}s\nstdout:\n{out}\nstderr:\n{err}") from None
        return Child(p.returncode, out, err)

    def compile_c(self, name: str, source: str, *extra: str) -> Path:
        src = self.tmp / f"{name}.c"
        out = self.tmp / name
        src.write_text(textwrap.dedent(source))
        p = subprocess.run(["gcc", "-O1", "-Wall", "-Werror", f"-I{HEADERS}", str(src), "-o", str(out), *extra,
                            f"-Wl,-rpath-link,{self.fake_dir}", "-ldl", "-lpthread"], capture_output=True, text=True)
        if p.returncode:
            raise AssertionError(f"compiling {name} failed:\n{p.stderr}")
        return out

    def c_env(self, extra: dict[str, str] | None = None, preload: bool = True) -> dict[str, str]:
        """base_env for a compiled program: the fake libraries found first, the shim preloaded"""
        e = self.base_env(extra)
        e["LD_LIBRARY_PATH"] = str(self.fake_dir) + (":" + e["LD_LIBRARY_PATH"] if e.get("LD_LIBRARY_PATH") else "")
        if preload:
            e["LD_PRELOAD"] = str(self.shim)
        return e

    def run_c(self, exe: Path, env: dict[str, str] | None = None, preload: bool = True, timeout: float = 60,
              args: list[str] | None = None, stdin: str | None = None, prefix: list[str] | None = None) -> Child:
        """prefix: a command that runs the program (pid_namespace_prefix()); the shim is preloaded into the
        program only, not into the prefix's own processes"""
        e = self.c_env(env, preload)
        cmd = [str(exe), *(args or [])]
        if prefix:
            cmd = [*prefix, "env", f"LD_PRELOAD={e.pop('LD_PRELOAD')}", *cmd] if preload else [*prefix, *cmd]
        p = subprocess.run(cmd, env=e, input=stdin, capture_output=True, text=True, timeout=timeout)
        return Child(p.returncode, p.stdout, p.stderr)
