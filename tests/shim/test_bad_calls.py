"""NULL and out-of-range arguments, calls without a current context and calls from a thread that never made
one: every wrapped entry point answers with the driver's own code and never faults (HAMi's segfaults inside
the hook: NULL `free` in cuMemGetInfo, an unchecked cuCtxGetDevice indexing per-device arrays, a zero element
size dividing in cuMemAllocPitch). Each call runs in a forked child of one C program, once with the shim
preloaded (limits set and unset) and once against the fake driver alone; the answers must be equal, call by
call, and no child may die of a signal."""
from __future__ import annotations

import pytest

from .harness import Env

# Each CALL(name, expression) runs in a fork child, in the given situation:
#   bare    cuInit done, no context anywhere
#   thread  a context current on the main thread, the call from a fresh thread that never made one
#   ctx     a context current on the calling thread (bad arguments only)
PROGRAM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <cuda.h>
#include <nvml.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int phase; /* 0 bare, 1 thread, 2 ctx */
typedef int (*call_fn)(void);
static call_fn pending;
static int result;

static void *in_thread(void *arg) { (void)arg; result = pending(); return 0; }

static void setup(void)
{
    CUdevice d; CUcontext c;
    if (cuInit(0)) _exit(90);
    if (phase >= 1) {
        if (cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c)) _exit(91);
    }
}

static void run(const char *name, call_fn fn)
{
    int st;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(30); /* a call that hangs dies of SIGALRM (reported), never outlives the test */
        setup();
        pending = fn;
        if (phase == 1) {
            pthread_t t;
            if (pthread_create(&t, 0, in_thread, 0) || pthread_join(t, 0)) _exit(92);
        } else {
            result = fn();
        }
        printf("%d %s %d\n", phase, name, result);
        fflush(stdout);
        _exit(0);
    }
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st))
        printf("%d %s DIED(%s%d)\n", phase, name, WIFSIGNALED(st) ? "signal " : "exit ",
               WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
}

/* a pointer no allocation returned: readable memory (the fake driver reads a header where the real one
 * looks the address up), zeros */
static unsigned long long junk[64];
static CUdeviceptr dp;
static size_t sz, sz2;
static CUcontext cx;
static CUstream st_;
static CUmemoryPool pool;
static CUarray arr;
static CUmipmappedArray mip;
static CUmemGenericAllocationHandle mh;
static void *fnp;
static CUdriverProcAddressQueryResult qr;
static nvmlMemory_t m1;
static nvmlMemory_v2_t m2;

static CUmemAllocationProp prop(int type, int id)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = (CUmemLocationType)type;
    p.location.id = id;
    return p;
}
static CUmemPoolProps pprops(int type, int id)
{
    CUmemPoolProps p;
    memset(&p, 0, sizeof p);
    p.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = (CUmemLocationType)type;
    p.location.id = id;
    return p;
}
static CUmemPoolProps pp;
static CUmemAllocationProp ap;
static nvmlDevice_t nvdev(void)
{
    nvmlDevice_t d = 0;
    if (nvmlInit_v2() == 0) nvmlDeviceGetHandleByIndex_v2(0, &d);
    return d;
}

#define CALL(name, expr) static int name(void) { return (int)(expr); }
CALL(alloc_null, cuMemAlloc_v2(0, 1 << 20))
CALL(alloc_zero, cuMemAlloc_v2(&dp, 0))
CALL(alloc_huge, cuMemAlloc_v2(&dp, (size_t)-1))
CALL(alloc_ok, cuMemAlloc_v2(&dp, 1 << 20))
CALL(pitch_null, cuMemAllocPitch_v2(0, &sz, 64, 64, 4))
CALL(pitch_null_pitch, cuMemAllocPitch_v2(&dp, 0, 64, 64, 4))
CALL(pitch_elem0, cuMemAllocPitch_v2(&dp, &sz, 64, 64, 0))
CALL(pitch_elem3, cuMemAllocPitch_v2(&dp, &sz, 64, 64, 3))
CALL(pitch_huge, cuMemAllocPitch_v2(&dp, &sz, (size_t)-1, (size_t)-1, 16))
CALL(managed_null, cuMemAllocManaged(0, 1 << 20, CU_MEM_ATTACH_GLOBAL))
CALL(managed_flags, cuMemAllocManaged(&dp, 1 << 20, 0x77))
CALL(free_zero, cuMemFree_v2(0))
CALL(free_junk, cuMemFree_v2((CUdeviceptr)(uintptr_t)junk))
CALL(async_null, cuMemAllocAsync(0, 1 << 20, 0))
CALL(async_ok, cuMemAllocAsync(&dp, 1 << 20, 0))
CALL(async_junk_stream, cuMemAllocAsync(&dp, 1 << 20, (CUstream)(void *)junk))
CALL(frompool_null_pool, cuMemAllocFromPoolAsync(&dp, 1 << 20, 0, 0))
CALL(frompool_null_ptr, cuMemAllocFromPoolAsync(0, 1 << 20, 0, 0))
CALL(freeasync_zero, cuMemFreeAsync(0, 0))
CALL(freeasync_junk, cuMemFreeAsync((CUdeviceptr)(uintptr_t)junk, 0))
CALL(getinfo_null_both, cuMemGetInfo_v2(0, 0))
CALL(getinfo_null_free, cuMemGetInfo_v2(0, &sz))
CALL(getinfo_null_total, cuMemGetInfo_v2(&sz, 0))
CALL(getinfo_ok, cuMemGetInfo_v2(&sz, &sz2))
CALL(totalmem_null, cuDeviceTotalMem_v2(0, 0))
CALL(totalmem_dev99, cuDeviceTotalMem_v2(&sz, 99))
CALL(totalmem_devneg, cuDeviceTotalMem_v2(&sz, -1))
CALL(retain_null, cuDevicePrimaryCtxRetain(0, 0))
CALL(retain_dev99, cuDevicePrimaryCtxRetain(&cx, 99))
CALL(retain_devneg, cuDevicePrimaryCtxRetain(&cx, -1))
CALL(ctxcreate_null, cuCtxCreate_v4(0, 0, 0, 0))
CALL(ctxcreate_dev99, cuCtxCreate_v4(&cx, 0, 0, 99))
CALL(ctxsync, cuCtxSynchronize())
CALL(streamsync_null, cuStreamSynchronize(0))
CALL(streamcreate_null, cuStreamCreate(0, 0))
CALL(streamcreate_flags, cuStreamCreate(&st_, 0x7f))
CALL(defpool_null, cuDeviceGetDefaultMemPool(0, 0))
CALL(defpool_dev99, cuDeviceGetDefaultMemPool(&pool, 99))
CALL(mempool_null, cuDeviceGetMemPool(0, 0))
CALL(mempool_dev99, cuDeviceGetMemPool(&pool, 99))
CALL(poolcreate_null_props, cuMemPoolCreate(&pool, 0))
CALL(poolcreate_null_out, (pp = pprops(CU_MEM_LOCATION_TYPE_DEVICE, 0), cuMemPoolCreate(0, &pp)))
CALL(poolcreate_dev99, (pool = 0, cuMemPoolCreate(&pool, (pp = pprops(CU_MEM_LOCATION_TYPE_DEVICE, 99), &pp))))
CALL(poolcreate_devneg, cuMemPoolCreate(&pool, (pp = pprops(CU_MEM_LOCATION_TYPE_DEVICE, -1), &pp)))
CALL(pooldestroy_null, cuMemPoolDestroy(0))
CALL(memcreate_null_prop, cuMemCreate(&mh, 2 << 20, 0, 0))
CALL(memcreate_null_out, cuMemCreate(0, 2 << 20, (ap = prop(CU_MEM_LOCATION_TYPE_DEVICE, 0), &ap), 0))
CALL(memcreate_dev99, cuMemCreate(&mh, 2 << 20, (ap = prop(CU_MEM_LOCATION_TYPE_DEVICE, 99), &ap), 0))
CALL(memcreate_devneg, cuMemCreate(&mh, 2 << 20, (ap = prop(CU_MEM_LOCATION_TYPE_DEVICE, -1), &ap), 0))
CALL(memcreate_host, cuMemCreate(&mh, 2 << 20, (ap = prop(CU_MEM_LOCATION_TYPE_HOST, 0), &ap), 0))
CALL(memcreate_badtype, cuMemCreate(&mh, 2 << 20, (ap = prop(0x7fff, 0), &ap), 0))
CALL(memcreate_size0, cuMemCreate(&mh, 0, (ap = prop(CU_MEM_LOCATION_TYPE_DEVICE, 0), &ap), 0))
CALL(memrelease_zero, cuMemRelease(0))
CALL(memrelease_junk, cuMemRelease((CUmemGenericAllocationHandle)0xdead))
CALL(array_null_desc, cuArrayCreate_v2(&arr, 0))
CALL(array_null_out, cuArrayCreate_v2(0, &(CUDA_ARRAY_DESCRIPTOR){64, 64, CU_AD_FORMAT_FLOAT, 1}))
CALL(array_zero_channels, cuArrayCreate_v2(&arr, &(CUDA_ARRAY_DESCRIPTOR){64, 64, CU_AD_FORMAT_FLOAT, 0}))
CALL(array_badformat, cuArrayCreate_v2(&arr, &(CUDA_ARRAY_DESCRIPTOR){64, 64, (CUarray_format)0x7777, 1}))
CALL(array_huge, cuArrayCreate_v2(&arr, &(CUDA_ARRAY_DESCRIPTOR){(size_t)-1, (size_t)-1, CU_AD_FORMAT_FLOAT, 4}))
CALL(array3d_null_desc, cuArray3DCreate_v2(&arr, 0))
CALL(arraydestroy_null, cuArrayDestroy(0))
CALL(mip_null_desc, cuMipmappedArrayCreate(&mip, 0, 1))
CALL(mip_levels0, cuMipmappedArrayCreate(&mip, &(CUDA_ARRAY3D_DESCRIPTOR){64, 64, 0, CU_AD_FORMAT_FLOAT, 1, 0}, 0))
CALL(mipdestroy_null, cuMipmappedArrayDestroy(0))
CALL(launch_null, cuLaunchKernel(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0))
CALL(launchex_null, cuLaunchKernelEx(0, 0, 0, 0))
CALL(coop_null, cuLaunchCooperativeKernel(0, 1, 1, 1, 1, 1, 1, 0, 0, 0))
CALL(graphlaunch_null, cuGraphLaunch(0, 0))
CALL(procaddr_null_name, cuGetProcAddress_v2(0, &fnp, 12000, 0, &qr))
CALL(procaddr_null_out, cuGetProcAddress_v2("cuMemAlloc", 0, 12000, 0, &qr))
CALL(procaddr_unknown, cuGetProcAddress_v2("cuNoSuchThing", &fnp, 12000, 0, &qr))
CALL(procaddr_badflags, cuGetProcAddress_v2("cuMemAlloc", &fnp, 12000, 0x7f, &qr))
typedef CUresult (*procaddr4_t)(const char *, void **, int, cuuint64_t);
CALL(procaddr4_null_name, ((procaddr4_t)dlsym(RTLD_DEFAULT, "cuGetProcAddress"))(0, &fnp, 12000, 0))
typedef CUresult (*getinfo1_t)(unsigned int *, unsigned int *);
static getinfo1_t getinfo1(void)
{
    void *fn = 0;
    return cuGetProcAddress_v2("cuMemGetInfo", &fn, 3000, 0, &qr) == 0 ? (getinfo1_t)fn : 0;
}
static unsigned int u32;
CALL(getinfo1_null_both, getinfo1() ? getinfo1()(0, 0) : -1)
CALL(getinfo1_null_free, getinfo1() ? getinfo1()(0, &u32) : -1)
CALL(getinfo1_null_total, getinfo1() ? getinfo1()(&u32, 0) : -1)
CALL(nvml_info_null_dev, nvmlDeviceGetMemoryInfo(0, &m1))
CALL(nvml_info_null_out, nvmlDeviceGetMemoryInfo(nvdev(), 0))
CALL(nvml_info_junk_dev, nvmlDeviceGetMemoryInfo((nvmlDevice_t)0x10, &m1))
CALL(nvml_info2_null_out, nvmlDeviceGetMemoryInfo_v2(nvdev(), 0))
CALL(nvml_info2_null_dev, (m2.version = nvmlMemory_v2, nvmlDeviceGetMemoryInfo_v2(0, &m2)))
CALL(nvml_info2_badversion, (m2.version = 0x77, nvmlDeviceGetMemoryInfo_v2(nvdev(), &m2)))
CALL(nvml_shutdown_unopened, nvmlShutdown())
CALL(nvml_shutdown_twice, (nvmlInit_v2(), nvmlShutdown(), nvmlShutdown()))

#define ALL(X) X(alloc_null) X(alloc_zero) X(alloc_huge) X(alloc_ok) X(pitch_null) X(pitch_null_pitch) \
    X(pitch_elem0) X(pitch_elem3) X(pitch_huge) X(managed_null) X(managed_flags) X(free_zero) X(free_junk) \
    X(async_null) X(async_ok) X(async_junk_stream) X(frompool_null_pool) X(frompool_null_ptr) X(freeasync_zero) \
    X(freeasync_junk) X(getinfo_null_both) X(getinfo_null_free) X(getinfo_null_total) X(getinfo_ok) \
    X(totalmem_null) X(totalmem_dev99) X(totalmem_devneg) X(retain_null) X(retain_dev99) X(retain_devneg) \
    X(ctxcreate_null) X(ctxcreate_dev99) X(ctxsync) X(streamsync_null) X(streamcreate_null) \
    X(streamcreate_flags) X(defpool_null) X(defpool_dev99) X(mempool_null) X(mempool_dev99) \
    X(poolcreate_null_props) X(poolcreate_null_out) X(poolcreate_dev99) X(poolcreate_devneg) \
    X(pooldestroy_null) X(memcreate_null_prop) X(memcreate_null_out) X(memcreate_dev99) X(memcreate_devneg) \
    X(memcreate_host) X(memcreate_badtype) X(memcreate_size0) X(memrelease_zero) X(memrelease_junk) \
    X(array_null_desc) X(array_null_out) X(array_zero_channels) X(array_badformat) X(array_huge) \
    X(array3d_null_desc) X(arraydestroy_null) X(mip_null_desc) X(mip_levels0) X(mipdestroy_null) \
    X(launch_null) X(launchex_null) X(coop_null) X(graphlaunch_null) X(procaddr_null_name) \
    X(procaddr_null_out) X(procaddr_unknown) X(procaddr_badflags) X(procaddr4_null_name) \
    X(getinfo1_null_both) X(getinfo1_null_free) X(getinfo1_null_total) \
    X(nvml_info_null_dev) X(nvml_info_null_out) X(nvml_info_junk_dev) X(nvml_info2_null_out) \
    X(nvml_info2_null_dev) X(nvml_info2_badversion) X(nvml_shutdown_unopened) X(nvml_shutdown_twice)
#define RUN(n) run(#n, n);

int main(void)
{
    for (phase = 0; phase < 3; phase++) {
        ALL(RUN)
    }
    return 0;
}
"""

LIMITS = {"unlimited": {}, "limited": {"CUDA_DEVICE_MEMORY_LIMIT": "100m", "CUDA_DEVICE_SM_LIMIT": "50"}}
# As on a real GPU under a small limit: one context fits, a second would not (a call that creates nothing, a NULL
# output, is still the driver's to answer). NVML counts its openings as the real one does, so the shim's own
# session must not show through to a program that never opened NVML.
DRIVER = {"FAKE_CUDA_DEVICES": "2", "FAKE_CUDA_CTX_MB": "60"}
# Under a limit, a request far beyond it is refused CUDA_ERROR_OUT_OF_MEMORY before the driver sees it, as a
# full device answers; only with a current context (without one nothing is charged and the driver answers).
LIMIT_REFUSES = {"2:pitch_huge", "2:array_huge"}
OOM = "2"


def _answers(out: str) -> dict[str, str]:
    rows = [line.split(" ", 2) for line in out.splitlines() if line.strip()]
    return {f"{phase}:{name}": rc for phase, name, rc in rows}


@pytest.fixture(scope="module")
def exe(shim_path, fake_dir, tmp_path_factory):
    env = Env(shim_path, fake_dir, tmp_path_factory.mktemp("bad-calls"))
    return env, env.compile_c("bad_calls", PROGRAM, f"-L{fake_dir}", "-l:libcuda.so.1", "-l:libnvidia-ml.so.1")


@pytest.fixture(scope="module")
def driver_answers(exe) -> dict[str, str]:
    env, program = exe
    p = env.run_c(program, DRIVER, preload=False, timeout=120)
    assert p.rc == 0, p.stderr
    return _answers(p.stdout)


@pytest.mark.parametrize("limits", sorted(LIMITS))
def test_bad_calls_get_the_drivers_own_answer_and_never_fault(exe, driver_answers, limits: str) -> None:
    env, program = exe
    assert len(driver_answers) == 3 * 84, "every call ran in every situation against the driver alone"
    died = {k: v for k, v in driver_answers.items() if v.startswith("DIED")}
    assert not died, f"the fake driver itself faulted: {died}"
    p = env.run_c(program, {**DRIVER, **LIMITS[limits]}, timeout=120)
    assert p.rc == 0, p.stderr
    shim = _answers(p.stdout)
    faults = {k: v for k, v in shim.items() if v.startswith("DIED")}
    assert not faults, f"faulted under the shim: {faults}\n{p.stderr}"
    want = {k: OOM if limits == "limited" and k in LIMIT_REFUSES else v for k, v in driver_answers.items()}
    differ = {k: (want.get(k), v) for k, v in shim.items() if want.get(k) != v}
    assert not differ, f"(driver, shim) answers that differ: {differ}"
