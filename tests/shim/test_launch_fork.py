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
    """Deterministic: the only locks a child can inherit held are the shim's (the point of the test).

    cffi takes `ffi._lock` on a library attribute's first lookup and on a type string's first parse; a
    child forked while a thread held it would wait forever on the harness, not on the shim. So every
    function and type the threads and children use is resolved before the first thread starts. A child
    that hangs anyway is ended by its own alarm (SIGALRM, status != 0) and every child is reaped.
    """
    r = env.run_py("""
        import signal, time
        assert shim.cuInit(0) == 0
        mem_alloc, mem_free, set_current = shim.cuMemAlloc_v2, shim.cuMemFree_v2, shim.cuCtxSetCurrent
        ctx = [ctx_on(dev) for dev in (1, 0)][::-1]  # resolves cuDevicePrimaryCtxRetain too; ends on dev 0
        ffi.new("CUdeviceptr *")  # parsed once, cached from here on
        stop = threading.Event()

        def churn(dev):
            assert set_current(ctx[dev]) == 0
            p = ffi.new("CUdeviceptr *")
            while not stop.is_set():
                mem_alloc(p, 4096); mem_free(p[0])

        def reap(pid, limit=20.0):
            end = time.monotonic() + limit
            while time.monotonic() < end:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    return status
                time.sleep(0.005)
            os.kill(pid, signal.SIGKILL)  # past its own alarm: never leave it behind
            return os.waitpid(pid, 0)[1]

        ts = [threading.Thread(target=churn, args=(i % 2,), daemon=True) for i in range(4)]
        [t.start() for t in ts]
        statuses = []
        try:
            for _ in range(20):
                pid = os.fork()
                if pid == 0:
                    # the child: one thread, locks usable, accounting inherited
                    signal.alarm(10)
                    p = ffi.new("CUdeviceptr *")
                    ok = set_current(ctx[0]) == 0 and mem_alloc(p, 1 << 20) == 0 and mem_free(p[0]) == 0
                    os._exit(0 if ok else 3)
                statuses.append(reap(pid))
        finally:
            stop.set()
            [t.join() for t in ts]
        emit(statuses=statuses, info=meminfo())
    """, {"CUDA_DEVICE_MEMORY_LIMIT": "64m"}, timeout=90).result
    assert r["statuses"] == [0] * 20
    assert r["info"] == [0, 64 << 20, 64 << 20]
