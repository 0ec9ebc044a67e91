"""The threaded soak of tests/shim/test_soak.py on the real driver: processes x threads mixing sync, async,
pooled, managed and VMM allocations under one container limit, processes SIGKILLed at random and started
again. NVML in this process (no shim) samples what the driver really holds for the container's processes,
contexts (about 518 MiB each on an H200) and pool reserves (grown in 32 MiB steps) included: it must never be
above the limit. A process started again into a full container may be refused its context or its streams: it
exits then, and that is counted, not failed.

Two runs: sync, managed and VMM allocations, and every kind, stream-ordered pools included (a pool's growth is
charged before the driver makes it: accounting/pool.c). Each worker's streams take driver memory of their own (2 MiB
for every four on an H200), charged by a stand-in before they are made (accounting/overhead.c).
VGPU_SOAK_SECONDS (default 30),
VGPU_SOAK_PROCS (4), VGPU_SOAK_THREADS (4), VGPU_SOAK_LIMIT_MB (3072), VGPU_SOAK_KINDS (overrides both runs'
kinds)."""
from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from .conftest import Gpu
from .test_physical_gpu import Truth

pytestmark = pytest.mark.gpu
MiB = 1 << 20
SOAK_C = Path(__file__).resolve().parents[1] / "shim" / "soak.c"


def _charged(region: Path) -> dict[int, int]:
    """what the region charges each live slot's process on device 0 (its pid here is the host's: no container)"""
    from vgpu_patch.shim import region as R

    try:
        r = R.read_region(region)
        return {p.pid: p.used[0] for p in r.procs if p.status}
    except Exception:  # a torn read while the file is written: no figures this time
        return {}




@pytest.mark.parametrize("kinds", ["034", "01234"], ids=["no-pools", "all"])
def test_threaded_soak_with_random_kills_never_exceeds_the_limit_on_the_gpu(gpu: Gpu, kinds: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from vgpu_patch.shim_build.build import header_dir

    monkeypatch.setenv("VGPU_SOAK_KINDS", os.environ.get("VGPU_SOAK_KINDS", kinds))
    seconds = float(os.environ.get("VGPU_SOAK_SECONDS", "30"))
    procs = int(os.environ.get("VGPU_SOAK_PROCS", "4"))
    threads = int(os.environ.get("VGPU_SOAK_THREADS", "4"))
    limit_mb = int(os.environ.get("VGPU_SOAK_LIMIT_MB", "3072"))
    exe = gpu.tmp / "soak"
    no_region = [f"-D{k}=0" for k in ("PROC_NUM_OFF", "PROCS_OFF", "SLOT_SIZE", "STATUS_OFF", "USED0_OFF",
                                       "HOLD0_OFF", "REGION_SIZE")]  # the watcher, which is not run here
    subprocess.run(["gcc", "-O1", f"-I{header_dir()}", *no_region, str(SOAK_C), "-o", str(exe), "-l:libcuda.so.1",
                    "-lpthread"], check=True)
    env = gpu.env(f"{limit_mb}m")
    truth = Truth()
    rng = random.Random(20)
    alive: dict[int, subprocess.Popen] = {}
    lock = threading.Lock()
    samples, high, at_high = [0], [0], [""]
    done = threading.Event()

    every: set[int] = set()  # a killed process's memory counts for as long as the driver still holds it

    region = Path(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])

    def sample() -> None:
        while not done.is_set():
            with lock:
                pids, running_now = set(every), set(alive)
            each = truth.each(pids)
            used = sum(each.values())
            samples[0] += 1
            if used > high[0]:  # who held what: NVML's figure and the region's charge, MiB, by pid
                charged = _charged(region)
                high[0] = used
                at_high[0] = " ".join(f"{pid}{'' if pid in running_now else '(gone)'}:{b >> 20}/"
                                      f"{charged.get(pid, 0) >> 20}" for pid, b in sorted(each.items()))

    def spawn(secs: float) -> subprocess.Popen | None:
        p = subprocess.Popen([str(exe), "worker", str(threads), str(secs)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        with lock:
            alive[p.pid] = p
            every.add(p.pid)
        assert p.stdout is not None
        first = p.stdout.readline().strip()
        if first == "ready":
            return p
        out, err = p.communicate(timeout=60)  # refused its context or streams in a full container: it exits
        with lock:
            alive.pop(p.pid, None)
        assert ("cuDevicePrimaryCtxRetain" in first or "cuStreamCreate" in first) and "refused" in err, \
            (first, out, err[-2000:])
        return None

    sampler = threading.Thread(target=sample)
    sampler.start()
    running: list[subprocess.Popen] = []
    kills = refused = 0
    try:
        end = time.monotonic() + seconds
        running = [p for p in (spawn(seconds) for _ in range(procs)) if p]
        refused = procs - len(running)  # the first ones may fill the container before the last are made
        assert len(running) >= 2, refused
        while time.monotonic() < end - 2 and os.environ.get("VGPU_SOAK_KILLS") != "0":
            time.sleep(rng.uniform(0.5, 1.5))
            if not running:
                break
            victim = running.pop(rng.randrange(len(running)))
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait(timeout=30)
            with lock:
                alive.pop(victim.pid, None)
            kills += 1
            while (p := spawn(max(1.0, end - time.monotonic()))) is None and time.monotonic() < end - 1:
                refused += 1
                time.sleep(0.2)
            if p:
                running.append(p)
        for p in running:
            out, err = p.communicate(timeout=seconds + 120)
            assert p.returncode == 0, (p.returncode, out, err[-2000:])
            with lock:
                alive.pop(p.pid, None)
    finally:
        done.set()
        sampler.join()
        with lock:
            left = list(alive.values())
        for p in left:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    print(f"\nFIGURE GPU soak {procs} x {threads} threads, {seconds:.0f} s, limit {limit_mb} MiB: {kills} kills, "
          f"{refused} restarts refused a context, {samples[0]} NVML samples, highest {high[0] / MiB:.0f} MiB "
          f"(pid:NVML/charged MiB {at_high[0]})")
    assert (kills >= 3 or os.environ.get("VGPU_SOAK_KILLS") == "0") and samples[0] > 100
    assert high[0] <= limit_mb * MiB, f"the container held {high[0] / MiB:.0f} MiB of {limit_mb}"
