"""One visible device (the usual HAMi pod): the shim's memory wrappers skip cuCtxGetDevice, since a
context-bound call can only be on device 0, yet keep the driver's answers where there is no context."""
from __future__ import annotations

MiB = 1 << 20
ENV = {"CUDA_DEVICE_MEMORY_LIMIT": "64m", "FAKE_CUDA_DEVICES": "1"}


def test_one_device_needs_no_device_query_and_keeps_driver_errors(shim_env) -> None:
    child = shim_env.run_py("""
        assert shim.cuInit(0) == 0
        ctx_on(0)
        out = {}
        before = fake.fake_calls(b"cuCtxGetDevice")
        out["big"], big = alloc(60 * MiB)
        pairs = [alloc(MiB) for _ in range(3)]
        out["pairs"] = [rc for rc, _ in pairs] + [shim.cuMemFree_v2(p) for _, p in pairs]
        out["info"] = list(meminfo())
        out["queries"] = fake.fake_calls(b"cuCtxGetDevice") - before   # none on the hot path
        def worker():                                                 # no context on this thread
            out["nc_fits"] = alloc(MiB)[0]                            # charged, refused by the driver, given back
            out["nc_over"] = alloc(32 * MiB)[0]                       # over the limit: still the driver's error
            pitch = ffi.new("size_t *"); p = ffi.new("CUdeviceptr *")
            out["nc_pitch_over"] = shim.cuMemAllocPitch_v2(p, pitch, 32 * MiB, 1, 4)
            out["nc_managed_over"] = shim.cuMemAllocManaged(p, 32 * MiB, 1)
            out["nc_info"] = list(meminfo())
        t = threading.Thread(target=worker); t.start(); t.join()
        out["over"] = alloc(32 * MiB)[0]                              # with the context: over the limit
        out["after"] = list(meminfo())
        out["free_big"] = shim.cuMemFree_v2(big)
        out["end"] = list(meminfo())
        emit(**out)
    """, ENV)
    r = child.result
    assert r["big"] == 0 and r["pairs"] == [0] * 6
    assert r["info"] == [0, 4 * MiB, 64 * MiB]
    assert r["queries"] == 0
    assert (r["nc_fits"], r["nc_over"], r["nc_pitch_over"], r["nc_managed_over"]) == (201, 201, 201, 201)
    assert r["nc_info"] == [201, 0, 0]
    assert r["over"] == 2
    assert r["after"] == [0, 4 * MiB, 64 * MiB]  # nothing left charged by the refused calls
    assert r["free_big"] == 0 and r["end"] == [0, 64 * MiB, 64 * MiB]


def test_two_devices_still_ask_the_driver(shim_env) -> None:
    child = shim_env.run_py("""
        assert shim.cuInit(0) == 0
        ctx_on(1)
        rc, p = alloc(48 * MiB)
        emit(rc=rc, info=list(meminfo()), over=alloc(32 * MiB)[0], queries=fake.fake_calls(b"cuCtxGetDevice") > 0)
    """, {"CUDA_DEVICE_MEMORY_LIMIT_1": "64m", "FAKE_CUDA_DEVICES": "2"})
    r = child.result
    assert r == {"rc": 0, "info": [0, 16 * MiB, 64 * MiB], "over": 2, "queries": True}
