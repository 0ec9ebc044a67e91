"""`vgpu-patch build --reproduce MANIFEST`: rebuild what a build manifest describes and compare the bytes.

The manifest records every input (the C tree's digest, compiler and header versions, flags, target,
profile, defines); the rebuild uses this install's compiler and headers and the given (or packaged)
c_src, so a mismatch names the inputs that differ here, or says that none does. Nothing the manifest names
is run: its compiler is compared with the one used (this install's of the same kind), never called. Its
-D defines are checked against a release build's: each that differs is named in the verdict, and one this
version's shim build does not know is refused unless the caller allows it.
"""
from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..release import provenance
from ..report.errors import BuildError, UsageError
from . import manifest as manifest_mod
from . import toolchain
from .build import PROFILES, build_shim

# what a build depends on, as the manifest records it (everything else in it describes the output)
INPUT_KEYS = ("source_sha256", "hooks_def_sha256", "compiler", "headers", "arch", "target", "glibc_floor",
              "profile", "defines", "flags", "tool")


# the -D switches this version's shim build knows (c_src/vgpu.h's VGPU_VERSION, the profiles' own); a manifest's
# define outside these is unknown, and refused unless allowed
KNOWN_DEFINES = frozenset({"VGPU_VERSION"} | {d.split("=", 1)[0] for p in PROFILES.values() for d in p.defines})
_DEFINE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(=[^\x00-\x1f]*)?")


@dataclass(frozen=True)
class Reproduction:
    manifest: Path
    recorded: str  # the sha256 the manifest records
    rebuilt: str  # the sha256 of the rebuild
    differing: tuple[str, ...]  # the recorded inputs that are not this rebuild's
    not_release: tuple[str, ...] = ()  # the manifest's defines a release build does not have (all applied)
    compiler_named: str = ""  # the compiler the manifest names (compared, never run)
    compiler_used: str = ""  # this install's, of the same kind, that rebuilt it

    @property
    def ok(self) -> bool:
        return self.recorded == self.rebuilt

    def line(self) -> str:
        notes = ""
        if self.not_release:
            notes += f"; not a release build: it defines {', '.join(self.not_release)}"
        if self.compiler_named and self.compiler_named != self.compiler_used:
            notes += f"; rebuilt with this install's {self.compiler_used}, not the manifest's {self.compiler_named}"
        if self.ok:
            return f"reproduced: {self.manifest} describes sha256 {self.rebuilt}, and the rebuild has it{notes}"
        why = (f"inputs that differ here: {', '.join(self.differing)}" if self.differing else
               "every recorded input is the same, so the build is not reproducible here: report it")
        return (f"{self.manifest}: the rebuild has sha256 {self.rebuilt}, the manifest records {self.recorded} "
                f"({why}){notes}")

    def to_json(self) -> dict[str, Any]:
        return {"manifest": str(self.manifest), "ok": self.ok, "recorded_sha256": self.recorded,
                "rebuilt_sha256": self.rebuilt, "differing_inputs": list(self.differing),
                "defines_not_in_release": list(self.not_release),
                "compiler": {"named": self.compiler_named, "used": self.compiler_used}}


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = manifest_mod.read(path)
    except (OSError, ValueError) as e:
        raise UsageError(f"build manifest {path} is unreadable ({e}): give the libvgpu.so.json a build wrote") from e
    if isinstance(doc, dict) and doc.get("_type") == provenance.STATEMENT_TYPE:  # a provenance statement
        doc = provenance.manifest_of(provenance.check(doc, path), path)
    missing = [k for k in (*INPUT_KEYS, "sha256") if not isinstance(doc, dict) or k not in doc]
    if missing:
        raise UsageError(f"build manifest {path} lacks {', '.join(missing)}: it was not written by this version's "
                         "`vgpu-patch build`; rebuild with the version that wrote it")
    if doc["profile"] not in PROFILES:
        raise UsageError(f"build manifest {path} names profile {doc['profile']!r}, unknown to this version")
    compiler = doc["compiler"]
    if not isinstance(compiler, dict) or not isinstance(compiler.get("kind"), str):
        raise UsageError(f"build manifest {path} has no compiler kind: give the libvgpu.so.json a build wrote")
    defines = doc["defines"]
    if not isinstance(defines, list) or not all(isinstance(d, str) and _DEFINE_RE.fullmatch(d) for d in defines):
        raise UsageError(f"build manifest {path} has malformed defines ({str(defines)[:80]}): give the "
                         "libvgpu.so.json a build wrote")
    return doc


def not_in_release(defines: list[str]) -> list[str]:
    """The defines a release build of this version would not pass (its VGPU_VERSION aside, which names the tool)."""
    release = set(PROFILES["release"].defines)
    return [d for d in defines if not d.startswith("VGPU_VERSION=") and d not in release]


def reproduce(path: Path | str, src_dir: Path | None = None, *, allow_defines: bool = False) -> Reproduction:
    """Rebuild (into a temporary directory, removed afterwards) with this install's compiler of the manifest's kind,
    and compare with the manifest at `path`. A define unknown to this version is refused unless `allow_defines`."""
    path = Path(path)
    doc = _read(path)  # read once: every decision below is made from this copy
    kind = doc["compiler"]["kind"]
    named = "".join(c if c.isprintable() else "?" for c in str(doc["compiler"].get("name") or ""))[:120]
    compiler = toolchain.own_compiler(kind)  # never the manifest's name or path: that is compared, not run
    differ = not_in_release(doc["defines"])
    unknown = [d for d in differ if d.split("=", 1)[0] not in KNOWN_DEFINES]
    if unknown and not allow_defines:
        raise BuildError(f"build manifest {path} defines {', '.join(unknown)}, unknown to this version's shim build "
                         f"(a release build has none): refused, nothing was built; rerun with --allow-defines to "
                         "rebuild with them")
    implied = set(PROFILES[doc["profile"]].defines)
    extra = [d for d in differ if d not in implied]
    out = Path(tempfile.mkdtemp(prefix="vgpu-reproduce-"))
    try:
        again = build_shim(out, arch=doc["arch"], glibc=doc["glibc_floor"], compiler=compiler,
                           profile=doc["profile"], src_dir=src_dir, extra_defines=extra).manifest
    finally:
        shutil.rmtree(out, ignore_errors=True)
    differing = tuple(k for k in INPUT_KEYS if again.get(k) != doc.get(k))
    return Reproduction(path, str(doc["sha256"]), again["sha256"], differing, tuple(differ), named,
                        str(again["compiler"].get("name") or ""))
