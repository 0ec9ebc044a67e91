"""`vgpu-patch build --reproduce MANIFEST`: rebuild what a build manifest describes and compare the bytes.

The manifest records every input (the C tree's digest, compiler and header versions, flags, target,
profile, defines); the rebuild uses this install's compiler and headers and the given (or packaged)
c_src, so a mismatch names the inputs that differ here, or says that none does.
"""
from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError
from . import manifest as manifest_mod
from .build import PROFILES, build_shim

# what a build depends on, as the manifest records it (everything else in it describes the output)
INPUT_KEYS = ("source_sha256", "hooks_def_sha256", "compiler", "headers", "arch", "target", "glibc_floor",
              "profile", "defines", "flags", "tool")


@dataclass(frozen=True)
class Reproduction:
    manifest: Path
    recorded: str  # the sha256 the manifest records
    rebuilt: str  # the sha256 of the rebuild
    differing: tuple[str, ...]  # the recorded inputs that are not this rebuild's

    @property
    def ok(self) -> bool:
        return self.recorded == self.rebuilt

    def line(self) -> str:
        if self.ok:
            return f"reproduced: {self.manifest} describes sha256 {self.rebuilt}, and the rebuild has it"
        why = (f"inputs that differ here: {', '.join(self.differing)}" if self.differing else
               "every recorded input is the same, so the build is not reproducible here: report it")
        return (f"{self.manifest}: the rebuild has sha256 {self.rebuilt}, the manifest records {self.recorded} "
                f"({why})")

    def to_json(self) -> dict[str, Any]:
        return {"manifest": str(self.manifest), "ok": self.ok, "recorded_sha256": self.recorded,
                "rebuilt_sha256": self.rebuilt, "differing_inputs": list(self.differing)}


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = manifest_mod.read(path)
    except (OSError, ValueError) as e:
        raise UsageError(f"build manifest {path} is unreadable ({e}): give the libvgpu.so.json a build wrote") from e
    missing = [k for k in (*INPUT_KEYS, "sha256") if not isinstance(doc, dict) or k not in doc]
    if missing:
        raise UsageError(f"build manifest {path} lacks {', '.join(missing)}: it was not written by this version's "
                         "`vgpu-patch build`; rebuild with the version that wrote it")
    if doc["profile"] not in PROFILES:
        raise UsageError(f"build manifest {path} names profile {doc['profile']!r}, unknown to this version")
    return doc


def reproduce(path: Path | str, src_dir: Path | None = None) -> Reproduction:
    """Rebuild (into a temporary directory, removed afterwards) and compare with the manifest at `path`."""
    path = Path(path)
    doc = _read(path)
    compiler = "zig" if doc["compiler"].get("kind") == "zig" else doc["compiler"].get("name")
    implied = {d for d in doc["defines"] if d.startswith("VGPU_VERSION=")} | set(PROFILES[doc["profile"]].defines)
    extra = [d for d in doc["defines"] if d not in implied]
    out = Path(tempfile.mkdtemp(prefix="vgpu-reproduce-"))
    try:
        again = build_shim(out, arch=doc["arch"], glibc=doc["glibc_floor"], compiler=compiler,
                           profile=doc["profile"], src_dir=src_dir, extra_defines=extra).manifest
    finally:
        shutil.rmtree(out, ignore_errors=True)
    differing = tuple(k for k in INPUT_KEYS if again.get(k) != doc.get(k))
    return Reproduction(path, str(doc["sha256"]), again["sha256"], differing)
