"""What our shim exports: hooks.def (see sources.py), parsed. The vendor's exports, which `check` compares
with, are vgpu_patch.elf.reference.

One home for the list. `hooks.def` is the single table the C build expands (X-macro) into the
real-pointer table, the generated pass-through trampolines and the export version script; this module
parses the same file so Python (build, check, tests) never keeps a second copy.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .sources import find_hooks_def

# HOOK(name, lib, kind[, more fields appended later])
_HOOK_RE = re.compile(r"^\s*HOOK\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*(?:,[^)]*)?\)")


@dataclass(frozen=True)
class Hook:
    name: str
    lib: str  # CUDA | NVML | LIBC: where the real symbol is resolved
    kind: str  # PASS (generated trampoline) | OWN (C wrapper) | STUB (vendor-compat no-op)


def parse_hooks(path: Path | None = None) -> list[Hook]:
    """Every HOOK(...) line of hooks.def (default: the packaged one), in file order."""
    hooks = []
    for line in (path or find_hooks_def()).read_text().splitlines():
        m = _HOOK_RE.match(line)
        if m:
            hooks.append(Hook(*m.groups()))
    return hooks


# VARIANT(spelling, base): per-thread-stream and older-ABI spellings we wrap but never export
_VARIANT_RE = re.compile(r"^\s*VARIANT\(\s*(\w+)\s*,\s*(\w+)\s*\)")


def wrapped_variants(path: Path | None = None) -> dict[str, str]:
    """spelling -> base for every VARIANT(...) line: handed out by cuGetProcAddress/dlsym only."""
    out = {}
    for line in (path or find_hooks_def()).read_text().splitlines():
        m = _VARIANT_RE.match(line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def exported_names(path: Path | None = None) -> list[str]:
    """The names our shim must export, sorted."""
    return sorted(h.name for h in parse_hooks(path))
