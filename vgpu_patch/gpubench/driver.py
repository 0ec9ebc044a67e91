"""Is there a GPU to measure here, and which: libcuda.so.1 loaded and initialised in this process (no context is
made, so no GPU memory is taken), the device's name and the driver's version for the record."""
from __future__ import annotations

import ctypes
import os
import subprocess
from dataclasses import dataclass
from typing import Any, Callable

from ..report.errors import GpuError

CUDA = "libcuda.so.1"
NVML = "libnvidia-ml.so.1"


@dataclass(frozen=True)
class GpuInfo:
    library: str  # where libcuda.so.1 was loaded from
    devices: int
    name: str | None  # CUDA device 0, the one region_gpu measures
    driver: str | None  # the kernel driver's version, as nvidia-smi prints it
    cuda: str | None  # the CUDA version the driver supports, e.g. 13.0

    def to_json(self) -> dict[str, Any]:
        return {"library": self.library, "devices": self.devices, "name": self.name, "driver": self.driver,
                "cuda": self.cuda}

    def describe(self) -> str:
        facts = [f"driver {self.driver}" if self.driver else "", f"CUDA {self.cuda}" if self.cuda else "",
                 f"{self.devices} device(s)", self.library]
        return f"{self.name or 'GPU of unknown name'} ({', '.join(f for f in facts if f)})"


def _loaded_from(soname: str) -> str:
    """The file the dynamic linker mapped for `soname` (after a symlink chain it may be libcuda.so.580.x)"""
    try:
        with open("/proc/self/maps") as f:
            paths = [ln.split(None, 5)[5].strip() for ln in f if len(ln.split(None, 5)) == 6]
    except OSError:
        return soname
    stem = soname.split(".so")[0] + ".so"
    return next((p for p in paths if os.path.basename(p).startswith(stem)), soname)


def _error_name(cuda: ctypes.CDLL, rc: int) -> str:
    name = ctypes.c_char_p()
    try:
        if cuda.cuGetErrorName(rc, ctypes.byref(name)) == 0 and name.value:
            return f"{name.value.decode()} ({rc})"
    except AttributeError:  # a driver without it (the test suite's fake)
        pass
    return f"error {rc}"


def _string(call: Callable[[ctypes.Array, int], int]) -> str | None:
    """What a `(char *buf, int len)` query wrote, or None when it failed or is missing"""
    buf = ctypes.create_string_buffer(256)
    try:
        if call(buf, len(buf)) != 0:
            return None
    except AttributeError:  # this driver does not export it
        return None
    return buf.value.decode(errors="replace") or None


def _nvml() -> tuple[str | None, str | None]:
    """(device 0's name, the driver's version) from NVML"""
    try:
        nvml = ctypes.CDLL(NVML)
        if nvml.nvmlInit_v2() != 0:
            return None, None
    except (OSError, AttributeError):
        return None, None
    try:
        driver = _string(lambda b, size: nvml.nvmlSystemGetDriverVersion(b, size))
        dev = ctypes.c_void_p()
        name = None
        if nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0:
            name = _string(lambda b, size: nvml.nvmlDeviceGetName(dev, b, size))
        return name, driver
    except AttributeError:
        return None, None
    finally:
        nvml.nvmlShutdown()


def _nvidia_smi() -> tuple[str | None, str | None]:
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader", "-i", "0"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    parts = [x.strip() for x in p.stdout.strip().split(",")] if p.returncode == 0 else []
    return (parts[0], parts[1]) if len(parts) == 2 else (None, None)


def probe() -> GpuInfo:
    """The GPU here, or GpuError saying what is missing and what to do"""
    try:
        cuda = ctypes.CDLL(CUDA)
    except OSError as e:
        where = os.environ.get("LD_LIBRARY_PATH")
        raise GpuError(f"no {CUDA} found ({e}; searched {'LD_LIBRARY_PATH=' + where + ' and ' if where else ''}"
                       "the ldconfig cache): run `vgpu-patch bench` on a GPU node with the NVIDIA driver installed, "
                       "or put the driver's directory on LD_LIBRARY_PATH") from None
    library = _loaded_from(CUDA)
    rc = cuda.cuInit(0)
    if rc:
        raise GpuError(f"cuInit(0) in {library} failed with {_error_name(cuda, rc)}: check that nvidia-smi works "
                       "for this user and that the GPU's /dev/nvidia* files are there (a container needs them "
                       "mounted)")
    n = ctypes.c_int(0)
    rc = cuda.cuDeviceGetCount(ctypes.byref(n))
    if rc or n.value < 1:
        raise GpuError(f"{library} sees no GPU ({_error_name(cuda, rc) if rc else '0 devices'}): check "
                       f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')} and nvidia-smi")
    version = ctypes.c_int(0)
    cu_version = None
    if cuda.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value:
        cu_version = f"{version.value // 1000}.{version.value % 1000 // 10}"
    dev = ctypes.c_int(0)
    name = None
    if cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0:
        name = _string(lambda b, size: cuda.cuDeviceGetName(b, size, dev))
    nvml_name, driver = _nvml()
    if driver is None or (name or nvml_name) is None:
        smi_name, smi_driver = _nvidia_smi()
        nvml_name, driver = nvml_name or smi_name, driver or smi_driver
    return GpuInfo(library, n.value, name or nvml_name, driver, cu_version)
