"""Every spelling of every function we wrap reaches our wrapper through every lookup path: dlsym on
the libcuda handle, RTLD_DEFAULT, RTLD_NEXT, and cuGetProcAddress / cuGetProcAddress_v2 at every
CUDA version a runtime asks with (11.3 to 13.x), with and without the per-thread-stream flag.
The table walked is hooks.def itself (OWN hooks and VARIANT lines), so a spelling added there is
tested here without another list. Then each runtime generation's own path holds a 64m limit."""
from __future__ import annotations

import re

import pytest

from vgpu_patch.shim_build.surface import parse_hooks, wrapped_variants

from .harness import Env

# versions the CUDA runtimes pass (CUDART_VERSION of 11.3 .. 13.0) and the first ABIs' eras
VERSIONS = [2000, 3020, 4000, 7000, 10020, 11030, 11040, 11060, 11080, 12000, 12040, 12050, 12080, 13000]

WALK = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*gpa2_t)(const char *, void **, int, unsigned long long, int *);
typedef int (*gpa1_t)(const char *, void **, int, unsigned long long);

static const char *where(void *p)
{
    Dl_info i;
    const char *shim = getenv("T_SHIM_REAL");
    if (!p)
        return "NULL";
    if (!dladdr(p, &i) || !i.dli_fname)
        return "?";
    if (strcmp(realpath(i.dli_fname, NULL), shim) == 0)
        return "shim";
    return strstr(i.dli_fname, "libcuda") ? "driver" : i.dli_fname;
}

int main(int argc, char **argv)
{
    static const int versions[] = {VERSIONS};
    int global = argc > 1 && strcmp(argv[1], "global") == 0;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL));
    gpa2_t gpa2 = (gpa2_t)dlsym(h, "cuGetProcAddress_v2");
    gpa1_t gpa1 = (gpa1_t)dlsym(h, "cuGetProcAddress");
    char kind, name[128];

    printf("gpa %s %s\n", where((void *)gpa2), where((void *)gpa1));
    while (scanf(" %c %127s", &kind, name) == 2) {
        if (kind == 'S') {
            printf("S %s %s %s %s\n", name, where(dlsym(h, name)), where(dlsym(RTLD_DEFAULT, name)),
                   where(dlsym(RTLD_NEXT, name)));
            continue;
        }
        for (size_t v = 0; v < sizeof versions / sizeof versions[0]; v++)
            for (unsigned long long flags = 0; flags <= 2; flags += 2) {
                void *p1 = NULL, *p2 = NULL;
                int st, rc2 = gpa2(name, &p2, versions[v], flags, &st), rc1 = gpa1(name, &p1, versions[v], flags);
                if (rc2 == 0)
                    printf("B %s %d %llu v2 %s\n", name, versions[v], flags, where(p2));
                if (rc1 == 0)
                    printf("B %s %d %llu v1 %s\n", name, versions[v], flags, where(p1));
            }
    }
    return 0;
}
""".replace("VERSIONS", ", ".join(map(str, VERSIONS)))


def spellings() -> list[str]:
    own = {h.name for h in parse_hooks() if h.kind == "OWN" and h.lib == "CUDA"}
    return sorted(own | {v for v, base in wrapped_variants().items() if base in own})  # NVML's: test_process_listing


def base_of(name: str) -> str:
    return re.sub(r"_v\d+$", "", re.sub(r"_ptsz$", "", name))


def walk(env: Env, mode: str) -> list[list[str]]:
    exe = env.compile_c("walk", WALK)
    bases = sorted({base_of(s) for s in spellings()})
    lines = "".join(f"S {s}\n" for s in spellings()) + "".join(f"B {b}\n" for b in bases)
    child = env.run_c(exe, {"T_SHIM_REAL": str(env.shim.resolve())}, args=[mode], stdin=lines)
    assert child.rc == 0, child.stderr
    return [line.split() for line in child.stdout.splitlines()]


@pytest.mark.parametrize("mode", ["local", "global"])
def test_every_spelling_through_every_path(env: Env, mode: str) -> None:
    rows = walk(env, mode)
    assert rows[0] == ["gpa", "shim", "shim"]  # both cuGetProcAddress ABIs, from the handle
    seen = {r[1]: r[2:] for r in rows if r[0] == "S"}
    assert set(seen) == set(spellings())
    for name, (handle, default, nxt) in seen.items():
        assert handle == "shim", f"dlsym(libcuda, {name}) gave {handle}"
        # RTLD_DEFAULT / RTLD_NEXT from the program: ours, or nothing when only a local libcuda has it
        allowed = {"shim"} if mode == "global" else {"shim", "NULL"}
        assert default in allowed and nxt in allowed, (name, default, nxt)
    answers = [r for r in rows if r[0] == "B"]
    for b in {base_of(s) for s in spellings()}:
        # each answer the driver gives for a wrapped family is our wrapper
        for r in (r for r in answers if r[1] == b):
            assert r[5] == "shim", f"cuGetProcAddress{'' if r[4] == 'v1' else '_v2'}({b}, {r[2]}, flags {r[3]}) " \
                                   f"gave {r[5]}"
    # versions from the CUDA 11.3 runtime on: every family wrapped there is answered at each one
    for b in ("cuMemAlloc", "cuMemGetInfo", "cuDeviceTotalMem", "cuCtxCreate", "cuGetProcAddress",
              "cuMemAllocAsync", "cuLaunchKernel", "cuDevicePrimaryCtxRetain"):
        for v in (11030, 11080, 12000, 12080, 13000):
            for flags in ("0", "2"):
                assert [r for r in answers if r[1:4] == [b, str(v), flags]], (b, v, flags)


RUNTIME = r"""
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#undef cuGetProcAddress

typedef CUresult (*gpa2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa1_t)(const char *, void **, int, cuuint64_t);
static gpa1_t gpa1;
static gpa2_t gpa2;
static int version;
static cuuint64_t flags;

/* one entry point, fetched the way this runtime generation does */
static void *get(const char *name)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if ((gpa2 ? gpa2(name, &p, version, flags, &st) : gpa1(name, &p, version, flags)) != CUDA_SUCCESS || !p) {
        printf("missing %s\n", name);
        exit(3);
    }
    return p;
}

int main(int argc, char **argv)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CUresult (*init)(unsigned), (*dget)(CUdevice *, int), (*retain)(CUcontext *, CUdevice), (*set)(CUcontext);
    CUresult (*alloc)(CUdeviceptr *, size_t), (*afree)(CUdeviceptr), (*info)(size_t *, size_t *);
    CUresult (*total)(size_t *, CUdevice), (*aasync)(CUdeviceptr *, size_t, CUstream);
    CUdevice d;
    CUcontext c;
    CUdeviceptr p1, p2, p3;
    size_t f, t, tm;

    if (argc < 4)
        return 2;
    version = atoi(argv[2]);
    flags = strtoull(argv[3], NULL, 0);
    if (strcmp(argv[1], "cuGetProcAddress") == 0)
        gpa1 = (gpa1_t)dlsym(h, "cuGetProcAddress");   /* CUDA 11.x runtimes */
    else
        gpa2 = (gpa2_t)dlsym(h, "cuGetProcAddress_v2"); /* CUDA 12.x / 13.x */
    if (!gpa1 && !gpa2)
        return 4;
    init = get("cuInit");
    dget = get("cuDeviceGet");
    retain = get("cuDevicePrimaryCtxRetain");
    set = get("cuCtxSetCurrent");
    alloc = get("cuMemAlloc");
    afree = get("cuMemFree");
    info = get("cuMemGetInfo");
    total = get("cuDeviceTotalMem");
    aasync = get("cuMemAllocAsync");
    init(0);
    dget(&d, 0);
    retain(&c, d);
    set(c);
    total(&tm, d);
    CUresult a = alloc(&p1, 40 << 20), b = alloc(&p2, 40 << 20), e = aasync(&p3, 40 << 20, 0);
    info(&f, &t);
    printf("%d %d %d %zu %zu %zu\n", a, b, e, f >> 20, t >> 20, tm >> 20);
    afree(p1);
    info(&f, &t);
    printf("%zu\n", f >> 20);
    return 0;
}
"""


@pytest.mark.parametrize(("symbol", "version"), [
    ("cuGetProcAddress", 11030), ("cuGetProcAddress", 11080),             # CUDA 11.3 .. 11.8
    ("cuGetProcAddress_v2", 12000), ("cuGetProcAddress_v2", 12040),       # CUDA 12.x
    ("cuGetProcAddress_v2", 12080), ("cuGetProcAddress_v2", 13000),       # CUDA 12.8, 13.x
])
@pytest.mark.parametrize("flags", ["0", "2"])
def test_each_runtime_generation_holds_the_limit(env: Env, symbol: str, version: int, flags: str) -> None:
    exe = env.compile_c("runtime_gen", RUNTIME)
    child = env.run_c(exe, {"CUDA_DEVICE_MEMORY_LIMIT": "64m"}, args=[symbol, str(version), flags])
    assert child.rc == 0, (child.rc, child.stdout, child.stderr)
    # 40 MiB fits, the second 40 and an async 40 do not; 64 MiB shown everywhere; the free gives back
    assert child.stdout.split() == ["0", "2", "2", "24", "64", "64", "64"]
