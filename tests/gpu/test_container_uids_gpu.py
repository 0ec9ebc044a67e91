"""Every uid of a container draws from its one budget on the real driver (HAMi #1090, #1112): root holds
2.5 GiB of a 4g limit, then uid 65534 (a non-root worker, an `su` shell) is refused 2.5 GiB more, and sees
the container's figures. tests/shim/test_container_uids.py holds the same over the fake driver in CI."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from .conftest import Gpu

pytestmark = pytest.mark.gpu

GiB = 1 << 30

HOLDER = r"""
#include <stdio.h>
#include <cuda.h>
int main(void)
{
    CUdevice dev; CUcontext ctx; CUdeviceptr a = 0; size_t free_b = 0, total_b = 0;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
        return 3;
    int rc = (int)cuMemAlloc(&a, (size_t)5 << 29);   /* 2.5 GiB */
    cuMemGetInfo(&free_b, &total_b);
    printf("{\"rc\": %d, \"free\": %zu, \"total\": %zu}\n", rc, free_b, total_b);
    fflush(stdout);
    (void)getchar();
    return 0;
}
"""


def test_root_and_another_uid_share_one_budget_on_the_real_driver(gpu: Gpu) -> None:
    if os.geteuid() != 0:
        pytest.skip("running a process of another uid needs root")
    from vgpu_patch.shim_build.build import header_dir

    d = Path(tempfile.mkdtemp(prefix="uids-gpu-"))
    procs: list[subprocess.Popen] = []
    try:
        d.chmod(0o755)
        (d / "holder.c").write_text(HOLDER)
        subprocess.run(["gcc", "-O1", f"-I{header_dir()}", str(d / "holder.c"), "-o", str(d / "holder"),
                        "-l:libcuda.so.1"], check=True)
        shutil.copy(gpu.shim, d / "libvgpu.so")
        for f in d.iterdir():
            f.chmod(0o755)
        ctr = d / "ctr"
        ctr.mkdir(mode=0o755)
        env = gpu.env("4g", CUDA_DEVICE_MEMORY_SHARED_CACHE=str(ctr / "gpu.cache"), LD_PRELOAD=str(d / "libvgpu.so"))
        results = []
        for uid in (0, 65534):
            kw = {} if uid == 0 else {"user": uid, "group": uid, "extra_groups": []}
            p = subprocess.Popen([str(d / "holder")], env=env, cwd=str(d), stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 **kw)  # type: ignore[call-overload]
            procs.append(p)
            line = p.stdout.readline() if p.stdout else ""
            assert line, f"uid {uid}: {p.stderr.read() if p.stderr else ''}"
            results.append(json.loads(line))
        root, nobody = results
        assert root["rc"] == 0 and root["total"] == 4 * GiB, root
        assert nobody["rc"] == 2 and nobody["total"] == 4 * GiB, nobody  # CUDA_ERROR_OUT_OF_MEMORY
        assert nobody["free"] < 4 * GiB - (5 << 29), nobody  # root's 2.5 GiB (and contexts) counted
    finally:
        for p in procs:
            try:
                p.communicate("\n", timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
        shutil.rmtree(d, ignore_errors=True)
