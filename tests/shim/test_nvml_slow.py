"""A slow NVML (200 ms a call has been seen in the field) bounds what a context creation and a refusal cost:
the queries stay as few as the measurement needs, a burst of refusals pays one listing rather than one
each, and no call waits on NVML longer than those queries take (FAKE_NVML_DELAY_MS)."""
from __future__ import annotations

import pytest

from .harness import Env, in_init_pid_namespace, pid_namespace_prefix

DELAY_MS = 100

SLOW = r"""
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static double ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static CUcontext ctx;

static void *refuse(void *arg)
{
    CUdeviceptr p;

    cuCtxSetCurrent(ctx);
    *(int *)arg = cuMemAlloc(&p, (size_t)850 << 20);
    return NULL;
}

int main(void)
{
    pthread_t th[2];
    int rc[2];
    CUdevice d;
    CUcontext c, c2;
    CUdeviceptr p;
    unsigned long (*queries)(void), q;
    void *nvml;
    double t;
    int i, refused = 0;

    if (cuInit(0) || cuDeviceGet(&d, 0))
        return 1;
    t = ms();
    if (cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c))
        return 1;
    printf("first_ctx_ms %.0f\n", ms() - t);
    nvml = dlopen("libnvidia-ml.so.1", RTLD_NOLOAD | RTLD_LAZY);
    queries = nvml ? (unsigned long (*)(void))dlsym(nvml, "fake_nvml_queries") : 0;
    if (!queries)
        return 2;
    printf("first_ctx_q %lu\n", queries());
    q = queries();
    t = ms();
    if (cuCtxCreate(&c2, NULL, 0, d))
        return 3;
    printf("second_ctx_ms %.0f\n", ms() - t);
    printf("second_ctx_q %lu\n", queries() - q);
    cuCtxSetCurrent(c);
    usleep(30000); /* the context's figure is no longer fresh: the first refusal measures */
    q = queries();
    t = ms();
    printf("refused %d\n", cuMemAlloc(&p, (size_t)850 << 20));
    printf("refusal_ms %.0f\n", ms() - t);
    printf("refusal_q %lu\n", queries() - q);
    q = queries();
    t = ms();
    for (i = 0; i < 4; i++) /* right after it: its figure is fresh */
        refused += cuMemAlloc(&p, (size_t)850 << 20) == CUDA_ERROR_OUT_OF_MEMORY;
    printf("burst_refused %d\n", refused);
    printf("burst_ms %.0f\n", ms() - t);
    printf("burst_q %lu\n", queries() - q);
    ctx = c;
    usleep(30000); /* two threads refused at once: one listing between them, the other waits for it */
    q = queries();
    t = ms();
    for (i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, refuse, &rc[i]);
    for (i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    printf("pair_refused %d\n", (rc[0] == CUDA_ERROR_OUT_OF_MEMORY) + (rc[1] == CUDA_ERROR_OUT_OF_MEMORY));
    printf("pair_ms %.0f\n", ms() - t);
    printf("pair_q %lu\n", queries() - q);
    return 0;
}
"""


@pytest.mark.parametrize("namespace", [True, False], ids=["container-pid", "host-pid"])
def test_a_slow_nvml_bounds_contexts_and_refusals(env: Env, namespace: bool) -> None:
    """With every NVML query taking DELAY_MS: a later context pays one listing (well under three), the first
    outside a pid namespace two queries (the device figure before it, one listing that shows our own pid), in a
    container four (that figure, the identity probe's three listings) and no more, a refusal one listing,
    refusals within 20 ms of a listing none (they use its figure), and two threads refused at once one
listing between them (never two in flight: the second waits for the first's figure)."""
    if not namespace and not in_init_pid_namespace():
        pytest.skip("the tests run inside a pid namespace")
    exe = env.compile_c("slow", SLOW, f"-L{env.fake_dir}", "-l:libcuda.so.1", "-ldl", "-lpthread")
    child = env.run_c(exe, {"CUDA_DEVICE_MEMORY_LIMIT": "1000m", "FAKE_CUDA_CTX_MB": "100",
                            "FAKE_NVML_DELAY_MS": str(DELAY_MS),
                            **({"FAKE_NVML_PID_OFFSET": "1000"} if namespace else {})},
                      prefix=pid_namespace_prefix() if namespace else None)
    assert child.rc == 0, (child.rc, child.stdout, child.stderr)
    r = {k: float(v) for k, v in (line.split(None, 1) for line in child.stdout.splitlines())}
    assert r["refused"] == 2 and r["burst_refused"] == 4 and r["pair_refused"] == 2, r
    first = 4 if namespace else 2
    assert (r["first_ctx_q"], r["second_ctx_q"], r["refusal_q"], r["burst_q"], r["pair_q"]) == (first, 1, 1, 0, 1), r
    assert r["first_ctx_ms"] < (first + 1) * DELAY_MS, r
    assert r["second_ctx_ms"] < 3 * DELAY_MS, r
    assert r["refusal_ms"] < 2 * DELAY_MS, r
    assert r["burst_ms"] < DELAY_MS / 2, r
    assert r["pair_ms"] < 2 * DELAY_MS, r
