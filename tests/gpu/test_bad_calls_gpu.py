"""tests/shim/test_bad_calls.py on the real driver: the same NULL, out-of-range and no-context calls to every
wrapped entry point, answered through the shim exactly as the driver alone answers them (it is the driver's
own code for cuMemGetInfo with a NULL output, CUDA_ERROR_INVALID_VALUE, that the shim now passes on). A call
the driver itself faults on (a junk stream) must fault the same way, never only under the shim."""
from __future__ import annotations

import subprocess

import pytest

from .conftest import Gpu

pytestmark = pytest.mark.gpu


def test_bad_calls_answer_as_the_real_driver(gpu: Gpu) -> None:
    from shim.test_bad_calls import LIMIT_REFUSES, OOM, PROGRAM, _answers

    from vgpu_patch.shim_build.build import header_dir

    src = gpu.tmp / "bad_calls.c"
    src.write_text(PROGRAM)
    exe = gpu.tmp / "bad_calls"
    subprocess.run(["gcc", "-O1", "-Wall", f"-I{header_dir()}", str(src), "-o", str(exe), "-l:libcuda.so.1",
                    "-l:libnvidia-ml.so.1", "-ldl", "-lpthread"], check=True)
    runs = {}
    for name, limit, preload in (("driver", None, False), ("shim", None, True), ("limited", "1g", True)):
        p = subprocess.run([str(exe)], env=gpu.env(limit, preload=preload), capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, (name, p.stderr[-2000:])
        runs[name] = _answers(p.stdout)
    for name in ("shim", "limited"):
        # under a limit a request far beyond it is refused before the driver sees it, as a full device answers
        want = {k: OOM if name == "limited" and k in LIMIT_REFUSES else v for k, v in runs["driver"].items()}
        differ = {k: (want.get(k), v) for k, v in runs[name].items() if want.get(k) != v}
        assert not differ, (name, differ)
