#!/usr/bin/env python3
"""What PyTorch and NVML see on a real GPU, bare and under the shim (run on a GPU machine).

    python3 bench/gpu_limits.py out/libvgpu.so

Runs the same probe in fresh processes: bare, CUDA_DEVICE_MEMORY_LIMIT=4g, 0m, and a malformed limit,
printing mem_get_info, the device's total_memory, whether a 3 GiB and a 6 GiB tensor fit, the time per
step of a small-kernel loop, and nvmlDeviceGetMemoryInfo.
"""
from __future__ import annotations

import os
import subprocess
import sys

PROBE = r"""
import os, time, torch
free, total = torch.cuda.mem_get_info()
print(f"  mem_get_info free={free/2**30:.2f} GiB total={total/2**30:.2f} GiB; "
      f"total_memory={torch.cuda.get_device_properties(0).total_memory/2**30:.2f} GiB")
for gib in (3, 6):
    try:
        x = torch.empty(gib * 2**30, dtype=torch.uint8, device="cuda"); del x; torch.cuda.empty_cache()
        print(f"  {gib} GiB tensor: allocated")
    except torch.OutOfMemoryError:
        print(f"  {gib} GiB tensor: torch.OutOfMemoryError")
a = torch.ones(16, device="cuda")
for _ in range(200): a.add_(1)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(20000): a.add_(1)
torch.cuda.synchronize()
print(f"  small-kernel loop: {(time.perf_counter()-t)/20000*1e6:.2f} us/step")
try:
    import pynvml
    pynvml.nvmlInit(); m = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
    print(f"  nvml total={m.total/2**30:.2f} GiB used={m.used/2**30:.2f} GiB")
except Exception as e:  # nvidia-ml-py missing: not the shim's concern
    print(f"  nvml: {e}")
"""


def main() -> int:
    shim = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else "out/libvgpu.so"
    cases = [("bare", None, False), ("shim, limit 4g", "4g", True), ("shim, limit 0m", "0m", True),
             ("shim, limit 10x (malformed)", "10x", True)]
    for i, (name, limit, preload) in enumerate(cases):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_DEVICE_MEMORY", "LD_PRELOAD"))}
        if preload:
            env["LD_PRELOAD"] = shim
            env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"/tmp/vgpu-bench-{os.getpid()}-{i}.cache"  # one container each
        if limit:
            env["CUDA_DEVICE_MEMORY_LIMIT"] = limit
        print(f"{name}:", flush=True)
        p = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
        out = p.stdout.rstrip() or "  (no output)"
        print(out)
        if p.returncode:
            lines = [ln for ln in p.stderr.splitlines() if ln.startswith("vgpu:")] or p.stderr.splitlines()[-1:]
            print(f"  exit {p.returncode}: " + " | ".join(lines[:2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
