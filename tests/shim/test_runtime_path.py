"""The CUDA runtime's path to the driver, under LD_PRELOAD: dlopen libcuda.so.1, dlsym
cuGetProcAddress_v2, then every entry point through it. The limit must hold on that path."""
from __future__ import annotations

from .harness import Env

PROGRAM = r"""
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>

typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

int main(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    gpa_t gpa = (gpa_t)dlsym(h, "cuGetProcAddress_v2");
    CUresult (*init)(unsigned), (*get)(CUdevice *, int), (*retain)(CUcontext *, CUdevice), (*set)(CUcontext);
    CUresult (*alloc)(CUdeviceptr *, size_t), (*afree)(CUdeviceptr), (*info)(size_t *, size_t *);
    CUresult (*aasync)(CUdeviceptr *, size_t, CUstream);
    CUdriverProcAddressQueryResult st;
    CUdevice d;
    CUcontext c;
    CUdeviceptr p1, p2, p3;
    size_t f, t;
    const cuuint64_t ptds = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

    gpa("cuInit", (void **)&init, 13000, ptds, &st);
    gpa("cuDeviceGet", (void **)&get, 13000, ptds, &st);
    gpa("cuDevicePrimaryCtxRetain", (void **)&retain, 13000, ptds, &st);
    gpa("cuCtxSetCurrent", (void **)&set, 13000, ptds, &st);
    gpa("cuMemAlloc", (void **)&alloc, 13000, ptds, &st);
    gpa("cuMemFree", (void **)&afree, 13000, ptds, &st);
    gpa("cuMemGetInfo", (void **)&info, 13000, ptds, &st);
    gpa("cuMemAllocAsync", (void **)&aasync, 13000, ptds, &st);
    if (!init || !get || !retain || !set || !alloc || !afree || !info || !aasync)
        return 3;
    init(0);
    get(&d, 0);
    retain(&c, d);
    set(c);
    CUresult a = alloc(&p1, 40 << 20), b = alloc(&p2, 40 << 20), e = aasync(&p3, 40 << 20, 0);
    info(&f, &t);
    printf("%d %d %d %zu %zu\n", a, b, e, f >> 20, t >> 20);
    afree(p1);
    info(&f, &t);
    printf("%zu\n", f >> 20);
    return 0;
}
"""


def test_limit_holds_through_dlsym_and_get_proc_address(env: Env) -> None:
    exe = env.compile_c("runtime_path", PROGRAM)
    child = env.run_c(exe, {"CUDA_DEVICE_MEMORY_LIMIT": "64m"})
    assert child.rc == 0, (child.rc, child.stderr)
    assert child.stdout.split() == ["0", "2", "2", "24", "64", "64"]
