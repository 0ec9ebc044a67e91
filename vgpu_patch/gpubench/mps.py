"""MPS beside the shim: a control daemon of our own (its pipe and log directory private to the run, so no other
MPS user of the node is touched), and the environment that makes a process its client."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from ..report.errors import GpuError

MPS_CONTROL = "nvidia-cuda-mps-control"


def mps_missing() -> str | None:
    """Why MPS cannot be measured here, or None"""
    if shutil.which(MPS_CONTROL) is None:
        return f"{MPS_CONTROL} not found on PATH"
    return None


def mps_env(tmp: Path) -> dict[str, str]:
    """What makes a process a client of mps_daemon(tmp)'s server"""
    pipe = str(tmp / "mps")
    return {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": pipe}


@contextlib.contextmanager
def mps_daemon(tmp: Path) -> Iterator[None]:
    """nvidia-cuda-mps-control -d for the block; quit afterwards, whatever happens."""
    (tmp / "mps").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **mps_env(tmp)}
    try:
        p = subprocess.run([MPS_CONTROL, "-d"], env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise GpuError(f"{MPS_CONTROL} -d could not start: {e}") from None
    if p.returncode:
        said = (p.stderr or p.stdout).strip().replace("\n", " / ") or "no output"
        raise GpuError(f"{MPS_CONTROL} -d exited {p.returncode}: {said}")
    try:
        yield
    finally:
        subprocess.run([MPS_CONTROL], input="quit\n", text=True, env=env, capture_output=True, timeout=60)
        time.sleep(1)  # the server lets go of the GPU after the daemon has answered
