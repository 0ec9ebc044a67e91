"""Launch wrappers reach the right driver entry; fork while other threads allocate never deadlocks."""
from __future__ import annotations

from .harness import Env


def test_launches_reach_the_driver(env: Env) -> None:
    r = env.run_py("""
        assert shim.cuInit(0) == 0
        rc = [shim.cuLaunchKernel(ffi.NULL, 1, 1, 1, 32, 1, 1, 0, ffi.NULL, ffi.NULL, ffi.NULL) for _ in range(10)]
        ffi2 = cffi.FFI()
        ffi2.cdef('''int cuLaunchCooperativeKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                                   unsigned, void *, void **);
                     int cuGraphLaunch(void *, void *);
                     int cuLaunchKernelEx(const void *, void *, void **, void **);''')
        s2 = ffi2.dlopen(os.environ["T_SHIM"])
        rc.append(s2.cuLaunchCooperativeKernel(ffi2.NULL, 1, 1, 1, 1, 1, 1, 0, ffi2.NULL, ffi2.NULL))
        rc.append(s2.cuGraphLaunch(ffi2.NULL, ffi2.NULL))
        rc.append(s2.cuLaunchKernelEx(ffi2.NULL, ffi2.NULL, ffi2.NULL, ffi2.NULL))
        emit(rc=rc, counts=[fake.fake_calls(n) for n in
                            (b"cuLaunchKernel", b"cuLaunchCooperativeKernel", b"cuGraphLaunch", b"cuLaunchKernelEx",
                             b"cuLaunchKernel_ptsz")])
    """).result
    assert r["rc"] == [0] * 13
    assert r["counts"] == [10, 1, 1, 1, 0]


def test_fork_while_threads_allocate(env: Env) -> None:
    r = env.run_py("""
        assert shim.cuInit(0) == 0
        # cffi takes ffi._lock on a library attribute's or a type's first use: a thread inside it at
        # fork time would leave the child stuck on it (a harness hazard, not the shim's), so touch
        # everything the threads and the children use before the threads start
        shim.cuMemAlloc_v2, shim.cuMemFree_v2, shim.cuDevicePrimaryCtxRetain, shim.cuCtxSetCurrent
        ffi.new("CUcontext *"), ffi.new("CUdeviceptr *")
        stop = False
        def churn(dev):
            ctx_on(dev)
            p = ffi.new("CUdeviceptr *")
            while not stop:
                shim.cuMemAlloc_v2(p, 4096); shim.cuMemFree_v2(p[0])
        ts = [threading.Thread(target=churn, args=(i % 2,)) for i in range(4)]
        [t.start() for t in ts]
        statuses = []
        for _ in range(20):
            pid = os.fork()
            if pid == 0:
                # the child: one thread, locks usable, accounting inherited
                ctx_on(0)
                rc, p = alloc(1 << 20)
                ok = rc == 0 and shim.cuMemFree_v2(p) == 0
                os._exit(0 if ok else 3)
            statuses.append(os.waitpid(pid, 0)[1])
        stop = True
        [t.join() for t in ts]
        ctx_on(0)
        emit(statuses=statuses, info=meminfo())
    """, {"CUDA_DEVICE_MEMORY_LIMIT": "64m"}, timeout=60).result
    assert r["statuses"] == [0] * 20
    assert r["info"] == [0, 64 << 20, 64 << 20]
