"""Builders for the cost tests and benches (issue 11, point 8): the fake driver with event entry
points, bench/shim_cost.c, and a shim built from an older commit's c_src for side-by-side runs."""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from regiontools import ROOT

from vgpu_patch.shim_build.build import build_shim, header_dir

FAKE = ROOT / "tests" / "fake_driver"
BASELINE = "68e8a26"  # the last commit before issue 11's changes


def build_fake_with_events(out: Path) -> Path:
    """out/libcuda.so.1 (fake_cuda.c + fake_events.c) and out/libnvidia-ml.so.1."""
    out.mkdir(parents=True, exist_ok=True)
    common = ["gcc", "-shared", "-fPIC", "-fvisibility=hidden", "-O2", "-Wall", "-Wextra", "-Werror",
              f"-I{header_dir()}", "-Wl,-Bsymbolic"]
    subprocess.run(common + ["-Wl,-soname,libcuda.so.1", str(FAKE / "fake_cuda.c"), str(FAKE / "fake_events.c"),
                             "-o", str(out / "libcuda.so.1"), "-lpthread"], check=True)
    subprocess.run(common + ["-Wl,-soname,libnvidia-ml.so.1", str(FAKE / "fake_nvml.c"), "-o",
                             str(out / "libnvidia-ml.so.1"), "-lpthread"], check=True)
    return out


def build_cost_tool(out: Path, fake: Path) -> Path:
    exe = out / "shim_cost"
    subprocess.run([shutil.which("gcc") or "cc", "-O2", "-Wall", "-Werror", f"-I{header_dir()}",
                    str(ROOT / "bench" / "shim_cost.c"), str(fake / "libcuda.so.1"), f"-Wl,-rpath,{fake}",
                    "-ldl", "-o", str(exe)], check=True)
    return exe


def build_shim_at(commit: str | None, out: Path, compiler: str | None = "gcc") -> Path:
    """libvgpu.so from this worktree (commit None), or from `git archive <commit> c_src vgpu_patch`
    built by that commit's own build module (the source layout moves between commits: vgpu_patch/build.py
    before the shim_build package)."""
    if not commit:
        return build_shim(out / "shim-head", compiler=compiler, glibc=None).library
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "c_src", "vgpu_patch"], check=True,
                         capture_output=True).stdout
    dest = out / f"src-{commit}"
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(dest)
    lib = out / f"shim-{commit}"
    code = ("import importlib, sys; from pathlib import Path\n"
            "try: build_shim = importlib.import_module('vgpu_patch.shim_build.build').build_shim\n"
            "except ImportError: build_shim = importlib.import_module('vgpu_patch.build').build_shim\n"
            f"print(build_shim(Path({str(lib)!r}), compiler={compiler!r}, glibc=None).library)")
    env = {**os.environ, "PYTHONPATH": str(dest)}
    cp = subprocess.run([sys.executable, "-c", code], cwd=dest, env=env, capture_output=True, text=True)
    if cp.returncode:
        raise RuntimeError(f"building {commit} failed: {cp.stderr[-2000:]}")
    return Path(cp.stdout.strip().splitlines()[-1])


def cost_env(shim: Path, fake: Path, cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "GPU_CORE", "LIBCUDA", "LD_PRELOAD"))}
    env.update({"LD_PRELOAD": str(shim), "LD_LIBRARY_PATH": str(fake), "FAKE_CUDA_DEVICES": "1",
                "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cache), "CUDA_DEVICE_MEMORY_LIMIT": "10g"})
    env.update(extra)
    return env


def kv(text: str) -> dict[str, float]:
    out = {}
    for tok in text.split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            out[k] = float(v)
    return out


def launch_cost(tool: Path, shim: Path, fake: Path, cache: Path, n: int, **env: str) -> dict[str, float]:
    cp = subprocess.run([str(tool), "launch", str(n)], env=cost_env(shim, fake, cache, **env), capture_output=True,
                        text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr
    return kv(cp.stdout)


def attach_storm(tool: Path, shim: Path, fake: Path, cache: Path, procs: int = 20) -> list[float]:
    """first-allocation times (us) of `procs` processes released at once through a start gate"""
    env = cost_env(shim, fake, cache)
    ps = [subprocess.Popen([str(tool), "attach"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for _ in range(procs)]
    import time

    time.sleep(0.5)  # all of them initialised and waiting at the gate
    for p in ps:
        p.stdin.write("g")
    for p in ps:
        p.stdin.flush()
    times = []
    for p in ps:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        times.append(kv(out)["first_alloc_us"])
    return sorted(times)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def start_storm(tool: Path, shim: Path, fake: Path, cache: Path, procs: int,
                timeout: float = 60) -> tuple[list[float], list[str]]:
    """`procs` processes started at once on one region, as a torchrun starts its workers: each one's start
    (exec, cuInit, context, the region attached by its first cuMemAlloc) in seconds, sorted, and each one's
    stderr. Every child is killed if the storm outlasts `timeout`."""
    import threading
    import time

    env = cost_env(shim, fake, cache)
    done: list[float] = [0.0] * procs
    errs: list[str] = [""] * procs
    t0 = time.perf_counter()
    ps = [subprocess.Popen([str(tool), "attach"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for _ in range(procs)]

    def wait(i: int, p: subprocess.Popen) -> None:
        try:
            _out, errs[i] = p.communicate("g", timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            _out, errs[i] = p.communicate()
            errs[i] += f"\nkilled after {timeout}s"
        done[i] = time.perf_counter() - t0
        if p.returncode:
            errs[i] += f"\nexit {p.returncode}"

    threads = [threading.Thread(target=wait, args=(i, p)) for i, p in enumerate(ps)]
    try:
        for t in threads:
            t.start()
    finally:
        for t in threads:
            if t.is_alive() or t.ident:
                t.join()
        for p in ps:
            if p.poll() is None:
                p.kill()
                p.wait()
    return sorted(done), errs
