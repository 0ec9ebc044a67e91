"""Only this process's own NVML entry is charged to it. NVML names host pids, so inside a container the
shim must find its entry among the device's processes; a pid alone is not enough evidence: a neighbour
may start during our context creation, NVML may list us late (so the one new pid is someone else's), or a
neighbour's host pid may equal our pid inside the container. The shim confirms its entry by a
probe (a small allocation only its own entry shows) and learns again when the evidence changes. Outside
any pid namespace host pids are ours and unique: the entry under our pid is ours, no probe needed.

The container cases run in a pid namespace of their own where one can be made (harness.pid_namespace_prefix):
outside one, a neighbour under our own pid cannot exist."""
from __future__ import annotations

import subprocess
import time

import pytest

from .harness import Child, Env, in_init_pid_namespace, pid_namespace_prefix

MiB = 1 << 20

PROGRAM = r"""
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

unsigned long long fake_used(int dev);

#define CHECK(x) do { CUresult r_ = (x); if (r_) { printf("FAIL %s = %d\n", #x, r_); return 1; } } while (0)
#define MB(x) ((size_t)(x) << 20)

int main(int argc, char **argv)
{
    CUdevice d;
    CUcontext c;
    CUdeviceptr a, b, e;
    size_t f = 0, t = 0;

    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&d, 0));
    CHECK(cuDevicePrimaryCtxRetain(&c, d));
    CHECK(cuCtxSetCurrent(c));
    usleep((useconds_t)atoi(argv[1]) * 1000);
    cuMemGetInfo(&f, &t);
    printf("free_after_ctx %zu\n", f >> 20);
    printf("a300 %d\n", cuMemAlloc(&a, MB(300)));
    printf("a500 %d\n", cuMemAlloc(&b, MB(500)));
    printf("a200 %d\n", cuMemAlloc(&e, MB(200)));
    printf("real %llu\n", fake_used(0) >> 20);
    return 0;
}
"""

# the context takes 100 MiB; a neighbour holds 700 MiB of the same GPU; our limit is 1000 MiB
BASE = {"CUDA_DEVICE_MEMORY_LIMIT": "1000m", "FAKE_CUDA_CTX_MB": "100", "FAKE_CUDA_MEM_MB": "4096",
        "FAKE_NVML_PID_OFFSET": "100000"}
CASES = {
    "neighbour-starts-with-us": ({"FAKE_NVML_OTHERS": "4242:700", "FAKE_NVML_OTHERS_WITH_US": "1"}, 0),
    "listed-late": ({"FAKE_NVML_OTHERS": "4242:700", "FAKE_NVML_OTHERS_WITH_US": "1",
                     "FAKE_NVML_SELF_LATE_MS": "300"}, 500),
    "neighbour-has-our-pid": ({"FAKE_NVML_OTHERS": "self:700"}, 0),
    # a neighbour growing at every listing while we are not listed yet: it grew while our probe was held,
    # and was taken for us (it does not fall back once the probe is released)
    "busy-neighbour-while-listed-late": ({"FAKE_NVML_OTHERS": "4242:700", "FAKE_NVML_OTHERS_GROW": "1",
                                          "FAKE_NVML_SELF_LATE_MS": "300"}, 500),
}


def _check_own_entry_charged(child: Child) -> None:
    assert child.rc == 0, (child.stdout, child.stderr)
    r = dict(line.split(None, 1) for line in child.stdout.splitlines())
    assert r["free_after_ctx"] == "900", (r, child.stderr)   # our context's 100 MiB, not the neighbour's 700
    assert (r["a300"], r["a500"]) == ("0", "0"), (r, child.stderr)
    assert r["a200"] == "2", (r, child.stderr)               # 100 + 300 + 500 + 200 > 1000: ours all counted
    assert int(r["real"]) <= 1000


@pytest.mark.parametrize("case", list(CASES))
def test_only_our_own_entry_is_charged(env: Env, case: str) -> None:
    extra, sleep_ms = CASES[case]
    prefix = pid_namespace_prefix()
    if prefix is None and case == "neighbour-has-our-pid":
        pytest.skip("a neighbour's host pid equal to ours needs a pid namespace of our own: none can be made here")
    exe = env.compile_c("identity", PROGRAM, f"-L{env.fake_dir}", "-l:libcuda.so.1")
    _check_own_entry_charged(env.run_c(exe, {**BASE, **extra}, args=[str(sleep_ms)], prefix=prefix))


# outside a pid namespace: NVML's pids are ours (no offset); a neighbour under our pid cannot exist
HOST_CASES = {k: v for k, v in CASES.items() if k != "neighbour-has-our-pid"}


@pytest.mark.skipif(not in_init_pid_namespace(), reason="the tests run inside a pid namespace")
@pytest.mark.parametrize("case", list(HOST_CASES))
def test_outside_a_pid_namespace_our_own_pid_is_our_entry(env: Env, case: str) -> None:
    """The entry under our pid is taken for ours without a probe (found at once, unless listed late: then by
    the first listing that shows it), and the limit holds exactly as in a container."""
    extra, sleep_ms = HOST_CASES[case]
    host = {k: v for k, v in BASE.items() if k != "FAKE_NVML_PID_OFFSET"}
    exe = env.compile_c("identity", PROGRAM, f"-L{env.fake_dir}", "-l:libcuda.so.1")
    child = env.run_c(exe, {**host, **extra, "LIBCUDA_LOG_LEVEL": "3"}, args=[str(sleep_ms)])
    _check_own_entry_charged(child)
    assert "NVML knows this process as host pid" in child.stderr, child.stderr


HOLDER = r"""
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    CUdevice d;
    CUcontext c;
    CUdeviceptr a;
    char line[8];

    if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c))
        return 1;
    printf("alloc %d\n", cuMemAlloc(&a, (size_t)atoi(argv[1]) << 20));
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))   /* hold it until told */
        return 0;
    return 0;
}
"""


def test_an_absurd_nvml_figure_is_not_charged(env: Env) -> None:
    """One process's NVML entry reads 2^53 bytes: it is not believed (one warning) and the
    container's limit still holds across both processes."""
    exe = env.compile_c("holder", HOLDER, f"-L{env.fake_dir}", "-l:libcuda.so.1")
    region = {"CUDA_DEVICE_MEMORY_SHARED_CACHE": str(env.tmp / "shared.cache"), "CUDA_DEVICE_MEMORY_LIMIT": "1000m",
              "FAKE_CUDA_MEM_MB": "4096"}

    def start(extra: dict[str, str]) -> subprocess.Popen[str]:
        return subprocess.Popen([str(exe), "600"], env=env.c_env({**region, **extra}), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    a = start({"FAKE_NVML_SELF_ABSURD": "1"})
    assert a.stdout is not None
    try:
        first = a.stdout.readline().strip()
        b = start({})
        second, b_err = b.communicate("\n", timeout=30)
        _, a_err = a.communicate("\n", timeout=30)
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert first == "alloc 0", a_err
    assert second.strip() == "alloc 2", b_err      # 600 + 600 > 1000: the region still adds both up
    assert a_err.count("not believed") == 1, a_err


COST = r"""
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

int main(void)
{
    CUdevice d;
    CUcontext c, c2;
    CUdeviceptr p;
    unsigned long (*queries)(void), q;
    void *nvml;

    if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c))
        return 1;
    nvml = dlopen("libnvidia-ml.so.1", RTLD_NOLOAD | RTLD_LAZY);
    queries = nvml ? (unsigned long (*)(void))dlsym(nvml, "fake_nvml_queries") : 0;
    if (!queries)
        return 2;
    printf("first_ctx %lu\n", queries());
    q = queries();
    if (cuCtxCreate(&c2, NULL, 0, d))
        return 3;
    printf("second_ctx %lu\n", queries() - q);
    cuCtxSetCurrent(c);
    usleep(30000); /* past the 20 ms between measurements near the limit */
    q = queries();
    printf("refused %d\n", cuMemAlloc(&p, (size_t)850 << 20));
    printf("refusal %lu\n", queries() - q);
    return 0;
}
"""


@pytest.mark.parametrize("namespace", [True, False], ids=["container-pid", "host-pid"])
def test_nvml_queries_per_context_and_refusal_are_bounded(env: Env, namespace: bool) -> None:
    """A loaded NVML (200 ms a call in the field) costs each context creation and each refusal as
    few queries as the measurement needs: the first context in a container 4 (the device figure before
    it, for the fallback, and the probe's three listings: before it, while it is held, which serves the
    measurement, and after its release; the figure after it only when the probe found nothing), outside
    a pid namespace 2 (the figure before it, one listing showing our pid); later ones 1, a refusal 1."""
    if not namespace and not in_init_pid_namespace():
        pytest.skip("the tests run inside a pid namespace")
    exe = env.compile_c("cost", COST, f"-L{env.fake_dir}", "-l:libcuda.so.1", "-ldl")
    child = env.run_c(exe, {"CUDA_DEVICE_MEMORY_LIMIT": "1000m", "FAKE_CUDA_CTX_MB": "100",
                            **({"FAKE_NVML_PID_OFFSET": "1000"} if namespace else {})},
                      prefix=pid_namespace_prefix() if namespace else None)
    assert child.rc == 0, (child.rc, child.stdout, child.stderr)
    r = dict(line.split(None, 1) for line in child.stdout.splitlines())
    assert r["refused"] == "2"
    assert (r["first_ctx"], r["second_ctx"], r["refusal"]) == ("4" if namespace else "2", "1", "1"), r


def _region_env(env: Env, extra: dict[str, str]) -> dict[str, str]:
    return env.c_env({"CUDA_DEVICE_MEMORY_SHARED_CACHE": str(env.tmp / "shared.cache"),
                      "CUDA_DEVICE_MEMORY_LIMIT": "1000m", "FAKE_CUDA_MEM_MB": "4096", "FAKE_CUDA_CTX_MB": "100",
                      **extra})


def test_a_context_counted_by_the_device_change_is_counted_at_least_as_the_last_one(env: Env) -> None:
    """Without NVML's process list, a context is counted by the device's used-memory change across its
    creation. A neighbour freeing meanwhile makes that change smaller than the context (to nothing here),
    so what the container's last context took counts when it is more: the limit still holds."""
    holder = env.compile_c("holder", HOLDER, f"-L{env.fake_dir}", "-l:libcuda.so.1")
    first = subprocess.run([str(holder), "0"], env=_region_env(env, {}), input="\n", capture_output=True,
                           text=True, timeout=30)       # measures its context: 100 MiB, left as the hint
    assert first.returncode == 0, first.stderr
    exe = env.compile_c("identity", PROGRAM, f"-L{env.fake_dir}", "-l:libcuda.so.1")
    child = subprocess.run([str(exe), "0"], env=_region_env(env, {
        "FAKE_NVML_PROCS_FAIL": "1", "FAKE_NVML_OTHERS": "4242:300", "FAKE_NVML_OTHERS_LEAVE": "1"}),
        capture_output=True, text=True, timeout=30)
    assert child.returncode == 0, (child.stdout, child.stderr)
    r = dict(line.split(None, 1) for line in child.stdout.splitlines())
    assert r["free_after_ctx"] == "900", (r, child.stderr)   # was 1000: the context's 100 MiB uncounted
    assert (r["a300"], r["a500"], r["a200"]) == ("0", "0", "2"), (r, child.stderr)
    assert int(r["real"]) <= 1000


LATE = r"""
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    CUdevice d;
    CUcontext c;
    CUdeviceptr a, b;
    char line[8];

    if (argc < 3 || cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c))
        return 1;
    printf("first %d\n", cuMemAlloc(&a, (size_t)atoi(argv[1]) << 20));
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 0;
    printf("second %d\n", cuMemAlloc(&b, (size_t)atoi(argv[2]) << 20));   /* near the limit: NVML read again */
    return 0;
}
"""


def test_a_process_listed_late_is_still_found_in_a_full_container(env: Env) -> None:
    """Until NVML lists a new process its context is counted by a guess, and finding its entry takes a
    probe allocation. The room for it is charged with the context and kept until the entry is found, so a
    neighbour filling the container meanwhile cannot leave the process on its guess for good."""
    exe = env.compile_c("late", LATE, f"-L{env.fake_dir}", "-l:libcuda.so.1")
    late = subprocess.Popen([str(exe), "1", "1"], env=_region_env(env, {"FAKE_NVML_SELF_LATE_MS": "300",
                                                                        "LIBCUDA_LOG_LEVEL": "3"}),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert late.stdout is not None and late.stdout.readline().strip() == "first 0"
        # a neighbour: 100 + 797 beside the late one's 100 + 1 and its room's 2; then the last 2 MiB
        filler = subprocess.run([str(exe), "797", "2"], env=_region_env(env, {}), input="\n", capture_output=True,
                                text=True, timeout=30)
        time.sleep(0.5)                               # the late one is listed by now
        late_out, late_err = late.communicate("\n", timeout=30)
    finally:
        if late.poll() is None:
            late.kill()
            late.wait()
    assert filler.stdout.split() == ["first", "0", "second", "2"], filler   # was granted: the probe's room
    assert "NVML knows this process" in late_err, late_err   # was never found: no room left for the probe
    assert "second 0" in late_out, (late_out, late_err)      # the room, no longer needed, serves it
