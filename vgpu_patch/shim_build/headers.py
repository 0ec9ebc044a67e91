"""Find the CUDA Driver API and NVML headers (cuda.h, nvml.h) the shim compiles against.

Order: `$CUDA_HOME/include`, `$CUDA_PATH/include`, `/usr/local/cuda/include` (an installed toolkit),
then the `nvidia-cuda-runtime` / `nvidia-nvml-dev` wheels (site-packages/nvidia/cu13|cu12/include).
A directory counts only when it holds both headers: toolkits often ship cuda.h without nvml.h.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path

from ..report.errors import BuildError

REQUIRED = ("cuda.h", "nvml.h")
_WHEEL_SUBDIRS = ("cu13", "cu12")
# the wheels that carry the headers (CUDA 13 names, then the older -cu12 ones), for the build manifest
HEADER_WHEELS = ("nvidia-cuda-runtime", "nvidia-nvml-dev", "nvidia-cuda-runtime-cu12", "nvidia-nvml-dev-cu12")


def _has_all(d: Path) -> bool:
    return all((d / h).is_file() for h in REQUIRED)


def toolkit_candidates() -> list[Path]:
    """Installed-toolkit include directories, in the order they are tried."""
    out = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            out.append(Path(os.environ[var]) / "include")
    out.append(Path("/usr/local/cuda/include"))
    return out


def wheel_candidates() -> list[Path]:
    """Include directories of the nvidia-* wheels on sys.path (namespace package `nvidia`)."""
    roots: list[Path] = []
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        roots.extend(Path(p) for p in spec.submodule_search_locations)
    else:  # not importable from here: still look next to each sys.path entry
        roots.extend(Path(p) / "nvidia" for p in sys.path if p)
    out = []
    for root in roots:
        for sub in _WHEEL_SUBDIRS:
            out.append(root / sub / "include")
        out.append(root / "cuda_runtime" / "include")  # older (CUDA 12) wheel layout
    return out


def find_header_dirs(toolkits: list[Path] | None = None, wheels: list[Path] | None = None) -> list[Path]:
    """Every include directory needed for cuda.h and nvml.h (one when a single dir has both).

    Older wheels split the headers (cuda_runtime/include vs nvml/include), so a pair of wheel
    directories is accepted too. `toolkits`/`wheels` override the search lists (tests).
    """
    wheels = wheel_candidates() if wheels is None else wheels
    cands = (toolkit_candidates() if toolkits is None else toolkits) + wheels
    for d in cands:
        if _has_all(d):
            return [d.resolve()]
    split_nvml = [d.parent.parent / "nvml" / "include" for d in wheels]
    cuda = [d for d in wheels if (d / "cuda.h").is_file()]
    nvml = [d for d in wheels + split_nvml if (d / "nvml.h").is_file()]
    if cuda and nvml:
        return [cuda[0].resolve(), nvml[0].resolve()]
    tried = ", ".join(str(d) for d in cands) or "no candidate directories"
    from ..release.install import extra_hint

    raise BuildError(
        "CUDA/NVML headers not found (need cuda.h and nvml.h; tried " + tried + "): "
        f"install a CUDA toolkit and set CUDA_HOME, or {extra_hint('build')}"
    )


def header_dir() -> Path:
    """The include directory holding cuda.h (and nvml.h in every layout we know of)."""
    return find_header_dirs()[0]


def header_packages(dirs: list[Path]) -> dict[str, str]:
    """{wheel name: version} of the installed wheels that provide cuda.h/nvml.h in `dirs` ({} for a toolkit)."""
    wanted = {Path(d).resolve() / h for d in dirs for h in REQUIRED}
    out = {}
    for name in HEADER_WHEELS:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in dist.files or ():
            if f.name in REQUIRED and Path(str(dist.locate_file(f))).resolve() in wanted:
                out[name] = dist.version
                break
    return out
