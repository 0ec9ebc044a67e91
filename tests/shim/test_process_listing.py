"""NVML's process listings inside a limited container show only the container's own processes (issue 35): those
whose host pid a live slot of the container's region records, as each of our processes writes the host pid its
identity probe found. Two containers (two regions) on one fake GPU each see only their own; a process of no
container is in neither. The memory figures are the driver's; the count / INSUFFICIENT_SIZE protocol is the
driver's; without a limit the listing passes through unchanged. The spellings the vendor does not export (the
_v3 listings nvml.h maps the unversioned names to, MPS _v2) are held too when a program takes them by dlsym."""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .harness import Env

K = 100000  # NVML names every process by getpid() + K: host pids, not the container's
INSUFFICIENT_SIZE = 7  # NVML_ERROR_INSUFFICIENT_SIZE

LISTER = r"""
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <cuda.h>
#include <dlfcn.h>
#include <nvml.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef nvmlReturn_t (*fn_t)(nvmlDevice_t, unsigned int *, void *);

int main(int argc, char **argv)
{
    /* linked to (the names the shim exports), then dlsym'd as pynvml and dlopen users do (from the NVML
       handle and RTLD_DEFAULT); the shim exports no _v3, so those reach it only through dlsym */
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
    struct { const char *name; fn_t fn; size_t size; } fns[] = {
        {"compute", (fn_t)nvmlDeviceGetComputeRunningProcesses, sizeof(nvmlProcessInfo_v1_t)},
        {"compute_v2", (fn_t)nvmlDeviceGetComputeRunningProcesses_v2, sizeof(nvmlProcessInfo_v2_t)},
        {"graphics", (fn_t)nvmlDeviceGetGraphicsRunningProcesses, sizeof(nvmlProcessInfo_v1_t)},
        {"graphics_v2", (fn_t)nvmlDeviceGetGraphicsRunningProcesses_v2, sizeof(nvmlProcessInfo_v2_t)},
        {"mps", (fn_t)nvmlDeviceGetMPSComputeRunningProcesses, sizeof(nvmlProcessInfo_v1_t)},
        {"compute_v2_dlsym", (fn_t)dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v2"),
         sizeof(nvmlProcessInfo_v2_t)},
        {"compute_v3", (fn_t)dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3"), sizeof(nvmlProcessInfo_t)},
        {"graphics_v3", (fn_t)dlsym(lib, "nvmlDeviceGetGraphicsRunningProcesses_v3"), sizeof(nvmlProcessInfo_t)},
        {"mps_v2", (fn_t)dlsym(lib, "nvmlDeviceGetMPSComputeRunningProcesses_v2"), sizeof(nvmlProcessInfo_v2_t)},
        {"mps_v3", (fn_t)dlsym(lib, "nvmlDeviceGetMPSComputeRunningProcesses_v3"), sizeof(nvmlProcessInfo_t)},
        {"compute_v3_default", (fn_t)dlsym(RTLD_DEFAULT, "nvmlDeviceGetComputeRunningProcesses_v3"),
         sizeof(nvmlProcessInfo_t)},
    };
    CUdevice d;
    CUcontext c;
    CUdeviceptr a;
    nvmlDevice_t h;
    char line[16];

    if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c) ||
        cuMemAlloc(&a, 8 << 20) || nvmlInit_v2() || nvmlDeviceGetHandleByIndex_v2(0, &h)) {
        printf("FAIL setup\n");
        return 1;
    }
    int hold = argc > 1 && strcmp(argv[1], "hold") == 0;  /* a worker: a context, no listing of its own */

    for (size_t f = 0; !hold && f < sizeof fns / sizeof fns[0]; f++) {
        unsigned n = 0, room, i;
        nvmlReturn_t rc;
        unsigned char *buf;

        if (!fns[f].fn) {
            printf("%s missing\n", fns[f].name);
            continue;
        }
        rc = fns[f].fn(h, &n, NULL);
        buf = calloc(n + 1, fns[f].size);

        printf("%s size %d %u\n", fns[f].name, rc, n);
        room = n;
        rc = fns[f].fn(h, &room, buf);
        printf("%s list %d %u", fns[f].name, rc, room);
        for (i = 0; rc == NVML_SUCCESS && i < room; i++) {
            unsigned pid;
            unsigned long long used;
            memcpy(&pid, buf + i * fns[f].size, sizeof pid);
            memcpy(&used, buf + i * fns[f].size + 8, sizeof used);
            printf(" %u:%llu", pid, used >> 20);
        }
        printf("\n");
        if (n) {
            room = n - 1;
            rc = fns[f].fn(h, &room, buf);
            printf("%s small %d %u\n", fns[f].name, rc, room);
        }
        free(buf);
    }
    if (hold) {  /* stays until told */
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin))
            return 0;
    }
    return 0;
}
"""

DLSYMD = {"compute_v2_dlsym", "compute_v3", "graphics_v3", "mps_v2", "mps_v3", "compute_v3_default"}
SPELLINGS = {"compute", "compute_v2", "graphics", "graphics_v2", "mps"} | DLSYMD
LIMITED = {"CUDA_DEVICE_MEMORY_LIMIT": "1000m", "FAKE_CUDA_CTX_MB": "100", "FAKE_CUDA_MEM_MB": "4096",
           "FAKE_NVML_PID_OFFSET": str(K)}


def lister(env: Env) -> Path:
    return env.compile_c("lister", LISTER, f"-L{env.fake_dir}", "-l:libcuda.so.1", "-l:libnvidia-ml.so.1")


@contextmanager
def holder(env: Env, exe: Path, extra: dict[str, str]) -> Iterator[int]:
    """A process of a container (its region: extra's cache file), with a context, listed by NVML; its host pid."""
    with subprocess.Popen([str(exe), "hold"], env=env.c_env(extra), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as p:
        assert p.stdout is not None and p.stdin is not None
        try:
            line = ""
            while line.strip() != "ready":
                line = p.stdout.readline()
                assert line, f"holder exited: {p.stderr.read() if p.stderr else ''}"
            yield p.pid + K
        finally:
            p.stdin.close()
            p.wait(timeout=30)


def listings(child_out: str) -> dict[str, dict[str, list[str]]]:
    out: dict[str, dict[str, list[str]]] = {}
    for line in child_out.splitlines():
        name, what, *rest = line.split()
        out.setdefault(name, {})[what] = rest
    return out


def run_lister(env: Env, exe: Path, extra: dict[str, str]) -> tuple[int, dict[str, dict[str, list[str]]]]:
    p = subprocess.Popen([str(exe)], env=env.c_env(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, (out, err)
    return p.pid + K, listings(out)


def test_two_containers_on_one_gpu_each_see_only_their_own_processes(env: Env, tmp_path: Path) -> None:
    exe = lister(env)
    a = {**LIMITED, "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(tmp_path / "a.cache")}
    b = {**LIMITED, "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(tmp_path / "b.cache")}
    with holder(env, exe, a) as pid_a, holder(env, exe, b) as pid_b:
        # the GPU as the driver lists it from each lister: itself, both holders and a process of no container
        others = {"FAKE_NVML_OTHERS": f"{pid_a}:50,{pid_b}:70,4242:30"}
        for extra, sibling, used in ((a, pid_a, "50"), (b, pid_b, "70")):
            me, seen = run_lister(env, exe, {**extra, **others})
            for name, r in seen.items():
                assert r["size"] == [str(INSUFFICIENT_SIZE), "2"], (name, r)  # NULL infos, count 0: the size
                assert r["list"][:2] == ["0", "2"], (name, r)
                entries = dict(e.split(":") for e in r["list"][2:])
                assert set(entries) == {str(me), str(sibling)}, (name, r)
                assert entries[str(sibling)] == used, (name, r)  # the driver's own figure
                assert r["small"] == [str(INSUFFICIENT_SIZE), "2"], (name, r)  # too small: the count needed
            assert set(seen) == SPELLINGS
            # a dlsym'd spelling the vendor does not export is filtered exactly as the exported _v2 is
            assert all(seen[v]["list"] == seen["compute_v2"]["list"] for v in DLSYMD), seen


def test_without_a_limit_the_listing_passes_through(env: Env, tmp_path: Path) -> None:
    exe = lister(env)
    extra = {k: v for k, v in LIMITED.items() if k != "CUDA_DEVICE_MEMORY_LIMIT"}
    me, seen = run_lister(env, exe, {**extra, "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(tmp_path / "c.cache"),
                                     "FAKE_NVML_OTHERS": "4242:30,4343:40"})
    assert set(seen) == SPELLINGS  # the _v3 spellings too: the driver's answer
    for name, r in seen.items():
        assert r["size"] == [str(INSUFFICIENT_SIZE), "3"], (name, r)
        entries = dict(e.split(":") for e in r["list"][2:])
        assert set(entries) == {str(me), "4242", "4343"} and entries["4343"] == "40", (name, r)
        assert r["small"] == [str(INSUFFICIENT_SIZE), "3"], (name, r)


def test_an_empty_container_listing_is_a_success_with_no_entries(env: Env, tmp_path: Path) -> None:
    """Only others' processes on the GPU (this one's entry not listed yet): count 0, NVML_SUCCESS, as a driver
    says when nothing runs."""
    exe = lister(env)
    _, seen = run_lister(env, exe, {**LIMITED, "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(tmp_path / "d.cache"),
                                    "FAKE_NVML_OTHERS": "4242:30", "FAKE_NVML_SELF_LATE_MS": "60000"})
    for name, r in seen.items():
        assert r["size"] == ["0", "0"] and r["list"] == ["0", "0"] and "small" not in r, (name, r)
