"""The threaded soak: many processes x threads mixing sync, async (the default pool), pooled (a created
pool), managed and VMM allocations under one container limit, processes SIGKILLed at random and restarted.
The fake driver's devices are shared by the processes (FAKE_CUDA_SHARED), so what a watcher samples is
the container's physical use, transient claims and pool reserves included: it must never be above the
limit, also while processes exit or die (their memory counts until they are gone:
tests/region/test_region_exit.py). Nor may the sum of the region's live slots, the figure HAMi's monitor
reads (each sampled at one instant). After everything exited nothing is left: no physical use, and a new
process gets the whole limit.

About 20 s here; VGPU_SOAK_SECONDS=600 (and VGPU_SOAK_PROCS, VGPU_SOAK_THREADS) for a longer run, and to
bisect a failure VGPU_SOAK_KINDS=12 (only kinds 1 and 2: 0 sync, 1 async, 2 pooled, 3 managed, 4 VMM) and
VGPU_SOAK_KILLS=0 (no kills).
"""
from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from pathlib import Path

from .harness import Env, region_defines

MiB = 1 << 20
LIMIT_MB = 256

PROGRAM = (Path(__file__).parent / "soak.c").read_text()


def _env(env: Env, shared: str, cache: str, preload: bool) -> dict[str, str]:
    return env.c_env({"CUDA_DEVICE_MEMORY_LIMIT": f"{LIMIT_MB}m", "FAKE_CUDA_SHARED": shared,
                      "CUDA_DEVICE_MEMORY_SHARED_CACHE": cache, "FAKE_CUDA_STREAM_MB": "2"}, preload)


def test_threaded_soak_with_random_kills_never_exceeds_the_limit(env: Env) -> None:
    seconds = float(os.environ.get("VGPU_SOAK_SECONDS", "20"))
    procs = int(os.environ.get("VGPU_SOAK_PROCS", "4"))
    threads = int(os.environ.get("VGPU_SOAK_THREADS", "4"))
    exe = env.compile_c("soak", PROGRAM, *region_defines(), f"-L{env.fake_dir}", "-l:libcuda.so.1")
    shared, cache = str(env.tmp / "device"), str(env.tmp / "region")
    worker_env, plain_env = _env(env, shared, cache, True), _env(env, shared, cache, False)
    rng = random.Random(20)
    children: list[subprocess.Popen] = []
    events: list[str] = []  # "time pid what", for the report of a failure

    def event(p: subprocess.Popen, what: str) -> None:
        events.append(f"{time.monotonic():.3f} {p.pid} {what}")

    def spawn(args: list[str], e: dict[str, str], stdin: int | None = subprocess.DEVNULL) -> subprocess.Popen | None:
        # the shim's refusal warnings go to a file: a pipe nobody reads would stall a long run
        with open(env.tmp / "stderr", "a") as err:
            p = subprocess.Popen([str(exe), *args], env=e, stdin=stdin, stdout=subprocess.PIPE, stderr=err,
                                 text=True, start_new_session=True)
        children.append(p)
        event(p, "started")
        assert p.stdout is not None
        first = p.stdout.readline().strip()
        if first.startswith("FAIL cuStreamCreate") and p.wait(timeout=30) == 1:  # a full container: refused
            event(p, "refused a stream")
            return None
        assert first in ("ready", "watching"), (first, p.stdout.read())
        return p

    def worker(secs: float) -> subprocess.Popen:
        give_up = time.monotonic() + 30
        while (p := spawn(["worker", str(threads), str(secs)], worker_env)) is None:
            assert time.monotonic() < give_up, "no room for a new process's streams for 30 s"
            time.sleep(0.05)
        return p

    watcher = spawn(["watch", str(LIMIT_MB * MiB)], plain_env, stdin=subprocess.PIPE)
    assert watcher
    kills = 0
    try:
        end = time.monotonic() + seconds
        running = [worker(seconds) for _ in range(procs)]
        finished: list[subprocess.Popen] = []
        while time.monotonic() < end - 1 and os.environ.get("VGPU_SOAK_KILLS") != "0":
            time.sleep(rng.uniform(0.2, 0.8))
            victim = running.pop(rng.randrange(len(running)))
            event(victim, "killed")
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=10)
            event(victim, "reaped")
            kills += 1
            running.append(worker(max(0.5, end - time.monotonic())))
        for p in running:
            p.wait(timeout=seconds + 60)
            event(p, "exited")
            finished.append(p)
        time.sleep(0.2)  # the watcher's last samples: nothing may be left
        out, _ = watcher.communicate("", timeout=30)
    finally:
        for p in children:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    r = {k: int(v) for k, v in (ln.split() for ln in out.splitlines() if not ln.startswith("over"))}
    over = next((ln for ln in out.splitlines() if ln.startswith("over")), "")  # MiB by pid, the first time
    if over:  # what the processes did around it
        at = float(over.split()[3])
        over += "; around it: " + ", ".join(e for e in events if abs(float(e.split()[0]) - at) < 2)
    limit = LIMIT_MB * MiB
    for p in finished:
        assert p.returncode == 0, (p.returncode, p.stdout.read() if p.stdout else "")
    stats = [line.split() for p in finished for line in (p.stdout.read() if p.stdout else "").splitlines()]
    granted = [sum(int(s[3]) for s in stats if s[0] == "kind" and s[1] == str(k)) for k in range(5)]
    refused = sum(int(s[5]) for s in stats if s[0] == "kind")
    assert (kills >= 3 or os.environ.get("VGPU_SOAK_KILLS") == "0") and r["samples"] > 1000, (kills, r)
    assert r["max_phys"] <= limit, f"physical use reached {r['max_phys'] / MiB:.1f} MiB of {LIMIT_MB}: {r}, {over}"
    assert r["max_region"] <= limit, f"the region's sum reached {r['max_region'] / MiB:.1f} MiB: {r}, {over}"
    if not os.environ.get("VGPU_SOAK_KINDS"):
        assert all(granted) and refused, f"every kind was granted and the limit was reached: {granted}, {refused}"
    assert r["last_phys"] == 0, f"memory left after every process exited: {r}"
    whole = subprocess.run([str(exe), "whole", str(limit)], env=worker_env, capture_output=True, text=True,
                           timeout=60)
    assert whole.stdout.strip() == "whole ok", (whole.stdout, whole.stderr)
