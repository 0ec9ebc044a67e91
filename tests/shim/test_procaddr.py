"""cuGetProcAddress(_v2) hands out our wrappers for wrapped functions (per-thread-stream variants
included) and leaves the driver's version/flag semantics and everything else untouched."""
from __future__ import annotations

from .harness import Env

MiB = 1 << 20

BODY = """
    PTDS = 2  # CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
    def addr(x): return int(ffi.cast("uintptr_t", x))
    def own(name): return addr(ffi.addressof(shim, name))
    def real(name): return addr(ffi.addressof(fake, name))
    def gpa(name, ver=13000, flags=0, v2=True):
        pfn = ffi.new("void **"); st = ffi.new("int *", -1)
        if v2:
            rc = shim.cuGetProcAddress_v2(name.encode(), pfn, ver, flags, st)
        else:
            rc = shim.cuGetProcAddress(name.encode(), pfn, ver, flags)
        return rc, addr(pfn[0]), st[0]
    assert shim.cuInit(0) == 0
    ctx_on(0)
    out = {}
    rc, p, st = gpa("cuMemAlloc")
    out["alloc_is_wrapper"] = (rc, st, p == own("cuMemAlloc_v2"))
    fn = ffi.cast("CUresult(*)(CUdeviceptr *, size_t)", p)
    d = ffi.new("CUdeviceptr *")
    out["alloc_via_pfn"] = [fn(d, 48 * MiB), fn(d, 48 * MiB)]        # limit 64m: the second is refused
    for v2 in (True, False):
        k = "v2" if v2 else "v1"
        rc, p, st = gpa("cuLaunchKernel", flags=PTDS, v2=v2)
        launch = ffi.cast("CUresult(*)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, "
                          "unsigned, CUstream, void **, void **)", p)
        before = fake.fake_calls(b"cuLaunchKernel_ptsz")
        out["ptsz_" + k] = (rc, p not in (real("cuLaunchKernel_ptsz"), real("cuLaunchKernel"), 0),
                            launch(ffi.NULL, 1, 1, 1, 1, 1, 1, 0, ffi.NULL, ffi.NULL, ffi.NULL),
                            fake.fake_calls(b"cuLaunchKernel_ptsz") - before)
        rc, p, st = gpa("cuLaunchKernel", flags=0, v2=v2)
        out["legacy_" + k] = (rc, p == own("cuLaunchKernel"))
    rc, p, st = gpa("cuMemAllocAsync", flags=PTDS)
    fn = ffi.cast("CUresult(*)(CUdeviceptr *, size_t, CUstream)", p)
    out["async_ptsz"] = (rc, p != real("cuMemAllocAsync_ptsz"), fn(d, 48 * MiB, ffi.NULL),
                         fake.fake_calls(b"cuMemAllocAsync_ptsz"))
    out["too_old"] = gpa("cuMemAllocAsync", ver=11000)               # the driver's answer, unchanged
    out["too_old_v1"] = gpa("cuMemAllocAsync", ver=11000, v2=False)
    out["unknown"] = gpa("cuNoSuchFunction")
    rc, p, st = gpa("cuDeviceGet")
    out["pass_untouched"] = (rc, p == real("cuDeviceGet"))
    rc, p, st = gpa("cuGetProcAddress")
    out["gpa_itself"] = (rc, p == own("cuGetProcAddress_v2"))
    rc, p, st = gpa("cuMemGetInfo")
    out["meminfo"] = (rc, p == own("cuMemGetInfo_v2"))
    out["null_pfn"] = shim.cuGetProcAddress_v2(b"cuMemAlloc", ffi.NULL, 13000, 0, ffi.NULL)
    emit(**out)
"""


def test_get_proc_address_hands_out_wrappers(env: Env) -> None:
    r = env.run_py(BODY, {"CUDA_DEVICE_MEMORY_LIMIT": "64m"}).result
    assert r["alloc_is_wrapper"] == [0, 0, True]
    assert r["alloc_via_pfn"] == [0, 2]
    assert r["ptsz_v2"] == [0, True, 0, 1] and r["ptsz_v1"] == [0, True, 0, 1]
    assert r["legacy_v2"] == [0, True] and r["legacy_v1"] == [0, True]
    # the per-thread async allocation went through our wrapper: 48 MiB more on a 64 MiB device is refused
    assert r["async_ptsz"] == [0, True, 2, 0]
    assert r["too_old"] == [500, 0, 2] and r["too_old_v1"][:2] == [500, 0]
    assert r["unknown"] == [500, 0, 1]
    assert r["pass_untouched"] == [0, True]
    assert r["gpa_itself"] == [0, True] and r["meminfo"] == [0, True]
    assert r["null_pfn"] == 1


def test_pass_through_and_missing_symbols(env: Env) -> None:
    r = env.run_py("""
        before = shim.cuDeviceGetCount(ffi.new("int *"))   # PASS before cuInit: the driver's own answer
        assert shim.cuInit(0) == 0
        n = ffi.new("int *")
        rc = shim.cuDeviceGetCount(n)                        # PASS trampoline, symbol present
        missing = shim.cuCtxGetCacheConfig(ffi.NULL)         # PASS, absent from the fake: NOT_FOUND
        stub = shim.nvml_preInit()                           # vendor-only STUB name
        emit(before=before, rc=rc, n=n[0], missing=missing, stub=stub)
    """, {"FAKE_CUDA_DEVICES": "3"}).result
    assert r == {"before": 3, "rc": 0, "n": 3, "missing": 500, "stub": 0}


def test_ignore_symbols_knob(env: Env) -> None:
    r = env.run_py("""
        assert shim.cuInit(0) == 0
        n = ffi.new("int *")
        emit(count=shim.cuDeviceGetCount(n), get=shim.cuDeviceGet(ffi.new("CUdevice *"), 0))
    """, {"VGPU_IGNORE_SYMBOLS": "cuDeviceGetCount,cuDeviceGetByPCIBusId"}).result
    assert r == {"count": 500, "get": 0}  # cuDeviceGet is a prefix of a listed name: not ignored


def test_driver_handing_out_internal_addresses(env: Env) -> None:
    """A driver whose cuGetProcAddress answers with other addresses than its exports: learnt at init."""
    r = env.run_py("""
        assert shim.cuInit(0) == 0
        ctx_on(0)
        def gpa(name, flags):
            pfn = ffi.new("void **"); st = ffi.new("int *")
            assert shim.cuGetProcAddress_v2(name, pfn, 13000, flags, st) == 0
            return pfn[0]
        bare = ffi.new("void **"); st = ffi.new("int *")
        fake.cuGetProcAddress_v2(b"cuMemAlloc", bare, 13000, 0, st)
        alloc = ffi.cast("CUresult(*)(CUdeviceptr *, size_t)", gpa(b"cuMemAlloc", 0))
        d = ffi.new("CUdeviceptr *")
        launch = gpa(b"cuLaunchKernel", 2)
        addr = lambda p: int(ffi.cast("uintptr_t", p))  # noqa: E731
        emit(internal=addr(bare[0]) != addr(ffi.addressof(fake, "cuMemAlloc_v2")),
             wrapped=addr(alloc) == addr(ffi.addressof(shim, "cuMemAlloc_v2")),
             rcs=[alloc(d, 40 * MiB), alloc(d, 40 * MiB)],
             launch_is_ours=addr(launch) != addr(ffi.addressof(fake, "cuLaunchKernel_ptsz")))
    """, {"CUDA_DEVICE_MEMORY_LIMIT": "64m", "FAKE_CUDA_PROC_ALIASES": "1"}).result
    assert r == {"internal": True, "wrapped": True, "rcs": [0, 2], "launch_is_ours": True}
