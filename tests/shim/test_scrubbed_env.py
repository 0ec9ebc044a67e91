"""A process started with a scrubbed environment (`env -i`, `su -`) still has the library preloaded
(HAMi's /etc/ld.so.preload) but none of HAMi's variables: it holds the memory limit of the one region
beside the library (c_src/region/find.c), as HAMi lays it out: /usr/local/vgpu/libvgpu.so and
/usr/local/vgpu/<id>.cache. Real processes over the fake driver; the SM side is in
tests/region/test_sm_share.py."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from vgpu_patch.shim import region as R

from .harness import Env

MiB = 1 << 20

PROGRAM = r"""
#include <stdio.h>
#include <cuda.h>
int main(void)
{
    CUdevice dev; CUcontext ctx; CUdeviceptr a = 0, b = 0;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
        return 3;
    printf("first=%d\n", (int)cuMemAlloc(&a, 60u << 20));
    printf("second=%d\n", (int)cuMemAlloc(&b, 60u << 20));
    return 0;
}
"""


def _scrubbed(env: Env, vgpu: Path, exe: Path, **extra: str) -> tuple[dict[str, str], str]:
    e = {"PATH": "/usr/bin:/bin", "LD_PRELOAD": str(vgpu / "libvgpu.so"), "LD_LIBRARY_PATH": str(env.fake_dir)}
    e.update(extra)
    p = subprocess.run([str(exe)], env=e, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return dict(line.split("=", 1) for line in p.stdout.split()), p.stderr


def test_scrubbed_environment_holds_the_region_beside_the_library(env: Env, tmp_path: Path) -> None:
    vgpu = tmp_path / "usr-local-vgpu"
    vgpu.mkdir()
    shutil.copy(env.shim, vgpu / "libvgpu.so")
    exe = env.compile_c("scrubbed", PROGRAM, f"-L{env.fake_dir}", "-l:libcuda.so.1")
    # the container's region (100 MiB) beside it: the second 60 MiB is refused
    (vgpu / "3b1f0c2e-6a7d.cache").write_bytes(R.encode(uuids=[], limit=[100 * MiB]))
    assert _scrubbed(env, vgpu, exe)[0] == {"first": "0", "second": "2"}  # CUDA_ERROR_OUT_OF_MEMORY
    # a limit variable means the environment is the container's own: it decides, the file is not guessed
    own = _scrubbed(env, vgpu, exe, CUDA_DEVICE_MEMORY_LIMIT="1g",
                    CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp_path / "own.cache"))[0]
    assert own == {"first": "0", "second": "0"}
    # Two regions beside it: none is guessed and the default path (/tmp/cudevshr.cache) is used. A process
    # here would create or join that file, a real one on a node with HAMi, so that case is held by
    # tests/region/test_sm_share.py, whose limiter_sim prints the choice (found=) without attaching it.
