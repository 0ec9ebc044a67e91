"""glibc version facts: what a library requires, and what a target's libc.so.6 provides.

A preloaded library is loaded by every program of a container with that container's glibc, so its
highest GLIBC_x.y requirement must not exceed the oldest glibc it will meet (the floor).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from ..report.errors import ElfError, UsageError
from .facts import ElfFacts, read_facts, version_defs

_GLIBC_RE = re.compile(r"^GLIBC_(\d+(?:\.\d+)+)$")
_FLOOR_RE = re.compile(r"^\d+\.\d+(?:\.\d+)?$")
# Named markers that stand for a release: a loader older than that release refuses the library.
ABI_MARKERS = {"GLIBC_ABI_DT_RELR": "2.36"}
PRIVATE = "GLIBC_PRIVATE"
# Where glibc's libc lives in an unpacked image, multiarch (Debian/Ubuntu) first, then lib64 (RHEL).
_LIBC_PATHS = {
    "x86_64": ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "usr/lib64"],
    "aarch64": ["lib/aarch64-linux-gnu", "usr/lib/aarch64-linux-gnu", "lib64", "usr/lib64"],
}


def version_key(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in release.split("."))


def release_of(version: str) -> str | None:
    """`GLIBC_2.34` -> `2.34`; `GLIBC_ABI_DT_RELR` -> `2.36`; anything else -> None."""
    m = _GLIBC_RE.match(version)
    if m:
        return m.group(1)
    return ABI_MARKERS.get(version)


def parse_floor(text: str | None) -> str | None:
    """Validate a `--glibc` value: `2.28`; `none`/`any` (or None) means no floor."""
    if text is None or text.lower() in ("none", "any"):
        return None
    text = text.strip()
    if text.upper().startswith("GLIBC_"):
        text = text[6:]
    if not _FLOOR_RE.match(text):
        raise UsageError(f"--glibc {text!r} is not a glibc release; write it like 2.28 (or 'none')")
    return text


def requirements_of(facts: ElfFacts) -> dict:
    """Group the file's imports by the GLIBC_* version they need (see `glibc_requirements`)."""
    symbols: dict[str, set[str]] = {}
    for imp in facts.imports:
        if imp.version and imp.version.startswith("GLIBC_"):
            symbols.setdefault(imp.version, set()).add(imp.name)
    if facts.relr:
        # ld adds the GLIBC_ABI_DT_RELR marker only when libc is linked; an older loader would skip
        # the packed relocations and crash on the first pointer it reads, so count it either way.
        symbols.setdefault("GLIBC_ABI_DT_RELR", set()).add("DT_RELR")
    releases = [r for r in (release_of(v) for v in symbols) if r]
    top = max(releases, key=version_key) if releases else None
    unknown = sorted(v for v in symbols if v != PRIVATE and release_of(v) is None)
    return {
        "max_version": top,
        "glibc_private": PRIVATE in symbols,
        "versions": sorted(symbols, key=lambda v: (release_of(v) is None, version_key(release_of(v) or "0"), v)),
        "symbols": {v: sorted(names) for v, names in symbols.items()},
        "unknown": unknown,
    }


def glibc_requirements(path: Path) -> dict:
    """What glibc a library needs, from .gnu.version_r.

    Returns {"max_version": "2.34" | None, "glibc_private": bool, "versions": ["GLIBC_2.2.5", ...],
    "symbols": {"GLIBC_2.34": ["dlopen", ...]}, "unknown": [GLIBC_* markers of no known release]}.
    """
    return requirements_of(read_facts(Path(path)))


def find_libc(root: Path, arch: str | None = None) -> Path:
    """The libc.so.6 of an unpacked image or rootfs, following symlinks inside `root`."""
    dirs = _LIBC_PATHS.get(arch or "", []) or [d for ds in _LIBC_PATHS.values() for d in ds]
    for d in dict.fromkeys(dirs + ["lib", "usr/lib"]):
        candidate = root / d / "libc.so.6"
        if os.path.lexists(candidate):
            return _resolve_inside(root, candidate)
    raise ElfError(f"no libc.so.6 under {root} (looked in lib*/ and usr/lib*/); give the libc file itself")


def _resolve_inside(root: Path, path: Path) -> Path:
    """Resolve symlinks as the image would see them: absolute targets are relative to `root`."""
    for _ in range(40):
        if not path.is_symlink():
            return path
        target = os.readlink(path)
        path = root / target.lstrip("/") if target.startswith("/") else path.parent / target
    raise ElfError(f"too many symlinks resolving libc.so.6 under {root}; give the libc file itself")


def glibc_floor_of_libc(path: Path, arch: str | None = None) -> str:
    """The newest GLIBC_x.y a libc.so.6 defines, e.g. `2.28`: the floor a shim must stay under.

    `path` is a libc.so.6 (fetched from a node, or inside an unpacked image) or an image's root
    directory, in which case its libc is looked up.
    """
    path = Path(path)
    if path.is_dir():
        path = find_libc(path, arch)
    releases = [m.group(1) for m in (_GLIBC_RE.match(v) for v in version_defs(path, "libc")) if m]
    if not releases:
        raise ElfError(f"libc {path} defines no GLIBC_x.y versions (not glibc, e.g. musl?); "
                       "a glibc shim cannot load there")
    return max(releases, key=version_key)
