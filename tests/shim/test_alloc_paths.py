"""Every allocation family over the fake driver: device taken from the call's own arguments,
host locations not charged, context-less threads, bounds-checked ids, malformed limits."""
from __future__ import annotations

import pytest

from .harness import Env

MiB = 1 << 20


@pytest.mark.parametrize("var,value", [
    ("CUDA_DEVICE_MEMORY_LIMIT_1", "10x"),
    ("CUDA_DEVICE_MEMORY_LIMIT", "1.5g"),
    ("CUDA_DEVICE_MEMORY_LIMIT_0", "-1"),
])
def test_malformed_limit_fails_every_allocation(env: Env, var: str, value: str) -> None:
    child = env.run_py("""
        init = shim.cuInit(0)
        fake.cuInit(0)                     # behind the shim's back, so allocations reach the wrappers
        ctx = ffi.new("CUcontext *"); fake.cuDevicePrimaryCtxRetain(ctx, 0); fake.cuCtxSetCurrent(ctx[0])
        rc, p = alloc(MiB)
        h = ffi.new("CUmemGenericAllocationHandle *")
        prop = ffi.new("CUmemAllocationProp *"); prop.type = 1; prop.location.type = 1; prop.location.id = 0
        emit(init=init, alloc=rc, vmm=shim.cuMemCreate(h, 2 * MiB, prop, 0),
             fake_allocs=fake.fake_calls(b"cuMemAlloc_v2"))
    """, {var: value})
    r = child.result
    assert r == {"init": 1, "alloc": 1, "vmm": 1, "fake_allocs": 0}
    msg = f"invalid {var}='{value}': "
    lines = [ln for ln in child.stderr.splitlines() if msg in ln]
    assert len(lines) == 1, child.stderr
    assert lines[0].startswith("vgpu: ") and lines[0].endswith("; fix the pod's limit")


def test_vmm_device_and_host_numa_from_contextless_thread(env: Env) -> None:
    child = env.run_py("""
        assert shim.cuInit(0) == 0
        out = {}
        def worker():
            # no context on this thread: the location alone decides
            d = ffi.new("CUdevice *")
            out["ctx"] = shim.cuCtxGetDevice(d)
            h = ffi.new("CUmemGenericAllocationHandle *")
            prop = ffi.new("CUmemAllocationProp *"); prop.type = 1
            prop.location.type = 1; prop.location.id = 1          # device 1
            out["dev1"] = shim.cuMemCreate(h, 48 * MiB, prop, 0); dev_handle = h[0]
            out["dev1_over"] = shim.cuMemCreate(h, 32 * MiB, prop, 0)
            prop.location.type = 3; prop.location.id = 0          # host NUMA node 0: not device memory
            out["numa"] = shim.cuMemCreate(h, 512 * MiB, prop, 0); numa_handle = h[0]
            prop.location.type = 2                                # host
            out["host"] = shim.cuMemCreate(h, 512 * MiB, prop, 0)
            prop.location.type = 1; prop.location.id = 7          # no such device: driver says so, no crash
            out["bad"] = shim.cuMemCreate(h, MiB, prop, 0)
            prop.location.id = -5
            out["neg"] = shim.cuMemCreate(h, MiB, prop, 0)
            out["null_prop"] = shim.cuMemCreate(h, MiB, ffi.NULL, 0)
            out["release_numa"] = shim.cuMemRelease(numa_handle)
            out["release"] = shim.cuMemRelease(dev_handle)
            out["again"] = shim.cuMemCreate(h, 64 * MiB, prop_dev(prop), 0)
        def prop_dev(prop):
            prop.location.type = 1; prop.location.id = 1; return prop
        t = threading.Thread(target=worker); t.start(); t.join()
        ctx_on(1)
        out["info"] = meminfo()
        emit(**out)
    """, {"CUDA_DEVICE_MEMORY_LIMIT_1": "64m"})
    r = child.result
    assert r["ctx"] == 201  # CUDA_ERROR_INVALID_CONTEXT, as the real driver
    assert (r["dev1"], r["dev1_over"], r["numa"], r["host"]) == (0, 2, 0, 0)
    assert r["bad"] == 101 and r["neg"] == 101 and r["null_prop"] == 1
    assert (r["release_numa"], r["release"], r["again"]) == (0, 0, 0)
    assert r["info"] == [0, 0, 64 * MiB]


@pytest.mark.parametrize("legacy", ["0", "1"], ids=["cuStreamGetDevice", "stream-ctx-push-pop"])
def test_stream_ordered_from_contextless_thread(env: Env, legacy: str) -> None:
    child = env.run_py("""
        assert shim.cuInit(0) == 0
        ctx_on(1)
        s = ffi.new("CUstream *"); assert shim.cuStreamCreate(s, 0) == 0
        stream = s[0]
        out = {}
        def worker():
            p = ffi.new("CUdeviceptr *")
            out["a"] = shim.cuMemAllocAsync(p, 40 * MiB, stream); a = p[0]
            out["b"] = shim.cuMemAllocAsync(p, 40 * MiB, stream)       # device 1 is limited to 64 MiB
            out["null_stream"] = shim.cuMemAllocAsync(p, MiB, ffi.NULL)  # no context: the driver refuses
            out["free"] = shim.cuMemFreeAsync(a, stream)
            out["c"] = shim.cuMemAllocAsync(p, 60 * MiB, stream)
            d = ffi.new("CUdevice *")
            out["ctx_after"] = shim.cuCtxGetDevice(d)                  # device lookup left no context behind
        t = threading.Thread(target=worker); t.start(); t.join()
        out["info"] = meminfo()
        emit(**out)
    """, {"CUDA_DEVICE_MEMORY_LIMIT_1": "64m", "FAKE_CUDA_LEGACY": legacy})
    r = child.result
    assert (r["a"], r["b"], r["null_stream"], r["free"], r["c"]) == (0, 2, 201, 0, 0)
    assert r["ctx_after"] == 201
    assert r["info"] == [0, 4 * MiB, 64 * MiB]


@pytest.mark.parametrize("legacy", ["0", "1"], ids=["pool-attributes", "recorded-pools"])
def test_pool_allocations_charge_the_pool_device(env: Env, legacy: str) -> None:
    child = env.run_py("""
        assert shim.cuInit(0) == 0
        ctx_on(0)                                   # current device 0, but the pools live elsewhere
        s = ffi.new("CUstream *"); assert shim.cuStreamCreate(s, 0) == 0
        pool = ffi.new("CUmemoryPool *")
        props = ffi.new("CUmemPoolProps *"); props.allocType = 1; props.location.type = 1; props.location.id = 1
        assert shim.cuMemPoolCreate(pool, props) == 0
        p = ffi.new("CUdeviceptr *")
        a = shim.cuMemAllocFromPoolAsync(p, 50 * MiB, pool[0], s[0])
        b = shim.cuMemAllocFromPoolAsync(p, 50 * MiB, pool[0], s[0])
        hp = ffi.new("CUmemoryPool *")
        props.location.type = 2; props.location.id = 0
        assert shim.cuMemPoolCreate(hp, props) == 0
        host = shim.cuMemAllocFromPoolAsync(p, 500 * MiB, hp[0], s[0])
        dp = ffi.new("CUmemoryPool *")
        assert shim.cuDeviceGetDefaultMemPool(dp, 1) == 0
        c = shim.cuMemAllocFromPoolAsync(p, 20 * MiB, dp[0], s[0])
        info0 = meminfo()
        ctx_on(1)
        emit(rcs=[a, b, host, c], info0=info0, info1=meminfo())
    """, {"CUDA_DEVICE_MEMORY_LIMIT": "64m", "FAKE_CUDA_LEGACY": legacy})
    r = child.result
    assert r["rcs"] == [0, 2, 0, 2]
    assert r["info0"] == [0, 64 * MiB, 64 * MiB]
    assert r["info1"] == [0, 14 * MiB, 64 * MiB]


def test_pitch_managed_and_arrays(env: Env) -> None:
    child = env.run_py("""
        assert shim.cuInit(0) == 0
        ctx_on(0)
        p = ffi.new("CUdeviceptr *"); pitch = ffi.new("size_t *")
        out = {}
        out["pitch0"] = shim.cuMemAllocPitch_v2(p, pitch, 1000, 1000, 0)          # element size 0: no crash
        out["pitch_null"] = shim.cuMemAllocPitch_v2(p, ffi.NULL, 1000, 1000, 4)
        out["pitch"] = shim.cuMemAllocPitch_v2(p, pitch, 1000, 1000, 4); out["pitch_value"] = pitch[0]
        pitched = p[0]
        out["after_pitch"] = meminfo()
        out["managed"] = shim.cuMemAllocManaged(p, 8 * MiB, 1); managed = p[0]
        arr = ffi.new("CUarray *")
        d2 = ffi.new("CUDA_ARRAY_DESCRIPTOR *"); d2.Width = 1024; d2.Height = 1024; d2.Format = 0x20; d2.NumChannels = 4
        out["arr2d"] = shim.cuArrayCreate_v2(arr, d2); a2 = arr[0]
        d3 = ffi.new("CUDA_ARRAY3D_DESCRIPTOR *"); d3.Width = 256; d3.Height = 256; d3.Depth = 64; d3.Format = 0x01
        d3.NumChannels = 1
        out["arr3d"] = shim.cuArray3DCreate_v2(arr, d3); a3 = arr[0]
        out["arr_null"] = shim.cuArrayCreate_v2(arr, ffi.NULL)
        mm = ffi.new("CUmipmappedArray *")
        out["mip"] = shim.cuMipmappedArrayCreate(mm, d3, 3)
        out["with_all"] = meminfo()
        big = ffi.new("CUDA_ARRAY3D_DESCRIPTOR *"); big.Width = 2**40; big.Height = 2**40; big.Depth = 2**40
        big.Format = 0x20; big.NumChannels = 4
        out["huge"] = shim.cuArray3DCreate_v2(arr, big)                           # saturated estimate: OOM
        for rc in (shim.cuMemFree_v2(pitched), shim.cuMemFree_v2(managed), shim.cuArrayDestroy(a2),
                   shim.cuArrayDestroy(a3), shim.cuMipmappedArrayDestroy(mm[0])):
            assert rc == 0
        out["end"] = meminfo()
        emit(**out)
    """, {"CUDA_DEVICE_MEMORY_LIMIT_0": "100m"})
    r = child.result
    assert r["pitch0"] == 1 and r["pitch_null"] == 1
    assert r["pitch"] == 0 and r["pitch_value"] == 1024
    assert r["after_pitch"] == [0, 100 * MiB - 1024 * 1000, 100 * MiB]  # charged the real pitch * height
    assert (r["managed"], r["arr2d"], r["arr3d"], r["arr_null"], r["mip"]) == (0, 0, 0, 1, 0)
    mip = sum(max(256 >> lv, 1) * max(256 >> lv, 1) * max(64 >> lv, 1) for lv in range(3))
    used = 1024 * 1000 + 8 * MiB + 16 * MiB + 4 * MiB + mip
    assert r["with_all"] == [0, 100 * MiB - used, 100 * MiB]
    assert r["huge"] == 2
    assert r["end"] == [0, 100 * MiB, 100 * MiB]


def test_out_of_range_device_ids_never_crash(env: Env) -> None:
    child = env.run_py("""
        assert shim.cuInit(0) == 0
        t = ffi.new("size_t *"); pool = ffi.new("CUmemoryPool *"); c = ffi.new("CUcontext *")
        rcs = []
        for dev in (-1, 2, 16, 17, 1000, 2**31 - 1, -2**31):
            rcs.append([shim.cuDeviceTotalMem_v2(t, dev), shim.cuDeviceGetDefaultMemPool(pool, dev),
                        shim.cuDevicePrimaryCtxRetain(c, dev)])
        emit(rcs=rcs)
    """, {"CUDA_DEVICE_MEMORY_LIMIT": "64m", "CUDA_DEVICE_MEMORY_LIMIT_15": "1g"})
    assert child.rc == 0, child.stderr
    assert all(row == [101, 101, 101] for row in child.result["rcs"])


def test_over_16_devices_not_indexed(env: Env) -> None:
    # the driver may report more devices than HAMi's 16 slots: ids >= 16 are simply not charged
    child = env.run_py("""
        assert shim.cuInit(0) == 0
        n = ffi.new("int *"); shim.cuDeviceGetCount(n)
        ctx_on(15)
        rc, p = alloc(80 * MiB)
        emit(n=n[0], rc=rc, info=meminfo())
    """, {"CUDA_DEVICE_MEMORY_LIMIT": "64m", "FAKE_CUDA_DEVICES": "16"})
    r = child.result
    assert r["n"] == 16 and r["rc"] == 2 and r["info"] == [0, 64 * MiB, 64 * MiB]


def test_free_of_untracked_pointer_passes_through(env: Env) -> None:
    child = env.run_py("""
        assert shim.cuInit(0) == 0
        ctx_on(0)
        p = ffi.new("CUdeviceptr *")
        assert fake.cuMemAlloc_v2(p, 4 * MiB) == 0     # allocated behind the shim's back
        rc = shim.cuMemFree_v2(p[0])
        emit(rc=rc, zero=shim.cuMemFree_v2(0), info=meminfo(), fake_used=fake.fake_used(0))
    """, {"CUDA_DEVICE_MEMORY_LIMIT": "64m"})
    r = child.result
    assert r == {"rc": 0, "zero": 0, "info": [0, 64 * MiB, 64 * MiB], "fake_used": 0}


def test_contextless_reporting_and_huge_sizes(env: Env) -> None:
    child = env.run_py("""
        assert shim.cuInit(0) == 0
        out = {}
        def worker():
            out["info"] = list(meminfo())                       # no context: the driver's error, no crash
            out["alloc"] = alloc(MiB)[0]
        t = threading.Thread(target=worker); t.start(); t.join()
        ctx_on(0)
        out["huge"] = alloc(2**64 - 1)[0]
        out["huge2"] = alloc(2**63)[0]
        pitch = ffi.new("size_t *"); p = ffi.new("CUdeviceptr *")
        out["pitch_overflow"] = shim.cuMemAllocPitch_v2(p, pitch, 2**40, 2**40, 4)
        out["after"] = meminfo()
        emit(**out)
    """, {"CUDA_DEVICE_MEMORY_LIMIT": "64m"})
    r = child.result
    assert r["info"] == [201, 0, 0] and r["alloc"] == 201
    assert r["huge"] == 2 and r["huge2"] == 2 and r["pitch_overflow"] == 2
    assert r["after"] == [0, 64 * MiB, 64 * MiB]


def test_unlimited_huge_request_leaves_no_trace(env: Env) -> None:
    child = env.run_py("""
        assert shim.cuInit(0) == 0
        ctx_on(0)
        rc = alloc(2**64 - 1)[0]                                  # the driver refuses; nothing stays counted
        ok = alloc(100 * MiB)[0]
        emit(rc=rc, ok=ok, info=meminfo())
    """)
    r = child.result
    assert r["rc"] == 2 and r["ok"] == 0 and r["info"] == [0, 924 * MiB, 1024 * MiB]


def test_pool_created_behind_our_back_uses_its_location(env: Env) -> None:
    """An imported pool (not seen at creation): the driver's location attributes name its device."""
    r = env.run_py("""
        assert shim.cuInit(0) == 0
        ctx_on(0)
        s = ffi.new("CUstream *"); assert shim.cuStreamCreate(s, 0) == 0
        pool = ffi.new("CUmemoryPool *")
        props = ffi.new("CUmemPoolProps *"); props.allocType = 1; props.location.type = 1; props.location.id = 1
        assert fake.cuMemPoolCreate(pool, props) == 0
        p = ffi.new("CUdeviceptr *")
        rcs = [shim.cuMemAllocFromPoolAsync(p, 40 * MiB, pool[0], s[0]) for _ in range(2)]
        ctx_on(1)
        emit(rcs=rcs, info1=meminfo(), attr_calls=fake.fake_calls(b"cuMemPoolGetAttribute"))
    """, {"CUDA_DEVICE_MEMORY_LIMIT_1": "64m"}).result
    assert r["rcs"] == [0, 2] and r["info1"] == [0, 24 * MiB, 64 * MiB]
    # the location is asked once, then remembered (2); each pool allocation reads the pool's reserve and
    # use before the call and its reserve after (3), because the pool is charged by what it holds; the
    # refused one stops after the first two (the pool's charge was settled by them); the report measures
    # what the driver holds, and settles the pool's charge to its reserve first (1). Near the limit each
    # reading of what the driver holds reads the pool's reserve before and after its NVML listing (a trim
    # meanwhile is not taken for memory held): the first allocation's reading (2), and the refused one's
    # settle and reading (1 + 2). The refused one does not measure again: the first allocation's reading is
    # under 20 ms old and nothing was measured since, so its figure serves the refusal (a slow NVML must not
    # make every refusal list again)
    assert r["attr_calls"] == 2 + 3 + 2 + 1 + 2 + 3
