"""`vgpu-patch bench` end to end over the fake driver's simulated GPU (kernels of FAKE_KERNEL_US on one GPU that
the processes share; the PTX is ignored), and its one-line errors where there is no driver or no GPU."""
from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS_ROWS = ["bare", "ours time 50", "ours time 25", "ours occupancy 50", "ours occupancy 25"]
SHARE_ROWS = ["one process, 50", "one process, 25", "two containers 50 / 50", "two containers 30 / 70",
              "50 beside an unlimited container", "bare pair (time-slicing ceiling)"]
ONSET_ROWS = ["no limit", "time 50", "time 25", "occupancy 50"]


def _env(lib_dir: Path, tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "GPU_CORE", "VGPU_", "FAKE_", "LD_"))}
    env.update(LD_LIBRARY_PATH=str(lib_dir), FAKE_GPU=str(tmp / "gpu"), FAKE_KERNEL_US="1000", **extra)
    return env


def _bench(env: dict[str, str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "bench", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_bench_prints_every_table_over_the_simulated_gpu(fake_gpu_dir: Path, tmp_path: Path) -> None:
    """Every part with the default limits, 0.3 s a run and one round: the whole bench in about half a minute.
    MPS is installed here (a stand-in that records being run) but --no-mps leaves it alone."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "mps-ran"
    (bin_dir / "nvidia-cuda-mps-control").write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    (bin_dir / "nvidia-cuda-mps-control").chmod(0o755)
    env = _env(fake_gpu_dir, tmp_path, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    p = _bench(env, "--seconds", "0.3", "--rounds", "1", "--no-mps", "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    tables = p.stderr  # with --json the tables go to stderr
    for name in STEPS_ROWS + SHARE_ROWS + ONSET_ROWS + ["32 blocks, short step", "every SM, long step"]:
        assert f"│ {name} " in tables, (name, tables)
    assert "MPS rows: absent, left out (--no-mps)" in tables
    assert "MPS 50" not in tables and not marker.exists()

    doc = json.loads(p.stdout)
    assert doc["schema"] == "vgpu-patch/bench/1"
    assert doc["mps"] == {"measured": False, "absent": "left out (--no-mps)"}
    assert doc["gpu"]["library"] == str(fake_gpu_dir / "libcuda.so.1") and doc["gpu"]["devices"] >= 1
    assert doc["shim"]["version"].startswith("vgpu-patch-shim ") and len(doc["shim"]["sha256"]) == 64
    assert [r["row"] for r in doc["steps"]] == STEPS_ROWS * 3
    assert all(r["ratio"] > 0 and r["p50_us"] > 0 and r["p99_us"] >= r["p50_us"] for r in doc["steps"])
    # a row's one round; the bare row holds every bare run of its shape (one beside each round of each row)
    assert [len(r["rounds"]) for r in doc["steps"][:5]] == [4, 1, 1, 1, 1]
    shares = {r["row"]: r for r in doc["shares"]["rows"]}
    assert list(shares) == SHARE_ROWS and doc["shares"]["bare_kernels_per_s"] > 0
    half = shares["one process, 50"]["shares"][0]["median"]
    assert 0.3 <= half <= 0.7, half  # the 1 ms kernels at SM 50: about half of a bare process's (CI is loaded)
    assert shares["one process, 25"]["shares"][0]["median"] < half
    assert len(shares["two containers 30 / 70"]["rounds"][0]) == 2
    onset = {r["row"]: r for r in doc["onset"]}
    assert list(onset) == ONSET_ROWS
    assert onset["no limit"]["onset"] is None and onset["no limit"]["cold_after_prefill"] is None
    assert all(isinstance(x, float) for x in onset["time 50"]["onset"]["hold_ms"])
    assert onset["time 50"]["cold_fresh"]["over_bare"][0] > 0


def test_mps_rows_run_under_a_daemon_of_the_benchs_own(fake_gpu_dir: Path, tmp_path: Path) -> None:
    """A stand-in nvidia-cuda-mps-control that logs how it is called (the fake driver ignores MPS's pipe, so its
    clients run as plain processes): the daemon is started for each shape's MPS rows and told to quit after them."""
    bin_dir, log = tmp_path / "bin", tmp_path / "mps.log"
    bin_dir.mkdir()
    (bin_dir / "nvidia-cuda-mps-control").write_text(f'#!/bin/sh\necho "$@" >> {log}\ncat >> {log}\n')
    (bin_dir / "nvidia-cuda-mps-control").chmod(0o755)
    env = _env(fake_gpu_dir, tmp_path, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    p = _bench(env, "--only", "steps", "--limits", "50", "--seconds", "0.1", "--rounds", "1")
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("│ MPS 50 % ") == 3 and "absent" not in p.stdout, p.stdout
    assert log.read_text().split() == ["-d", "quit"] * 3


def test_no_mps_on_path_is_a_reason_not_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from vgpu_patch.gpubench.mps import mps_missing

    monkeypatch.setenv("PATH", str(tmp_path))
    assert mps_missing() == "nvidia-cuda-mps-control not found on PATH"


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="a real libcuda.so.1 is installed here")
def test_without_a_driver_one_line_says_so(tmp_path: Path) -> None:
    """No libcuda.so.1 anywhere the dynamic linker looks: exit 1 before anything is built, one line on stderr (and
    with --json the error document on stdout)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for args in ([], ["--json"]):
        p = _bench(_env(empty, tmp_path), *args, timeout=60)
        assert p.returncode == 1, p.stderr
        assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert p.stderr.startswith("vgpu-patch: error: no libcuda.so.1 found ("), p.stderr
        assert "LD_LIBRARY_PATH" in p.stderr
        if args:
            assert json.loads(p.stdout)["ok"] is False


def test_a_driver_without_a_gpu_is_one_line(fake_gpu_dir: Path, tmp_path: Path) -> None:
    p = _bench(_env(fake_gpu_dir, tmp_path, FAKE_CUDA_DEVICES="0"), timeout=60)
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "sees no GPU (0 devices)" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("limits", ["", "50,abc", "0", "101"])
def test_a_bad_limit_is_a_usage_error(limits: str) -> None:
    from click.testing import CliRunner

    from vgpu_patch.cli import cli

    result = CliRunner().invoke(cli, ["bench", "--limits", limits])
    assert result.exit_code == 2, result.output
    assert "whole percentages from 1 to 100" in result.output
