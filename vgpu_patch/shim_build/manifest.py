"""The JSON manifest written next to a built shim (`libvgpu.so.json`) and the source hash it records.

Everything in it is a pure function of the inputs, so the manifest is as reproducible as the .so:
no timestamps, no absolute paths (flags show `$SRC`, `$CUDA_INCLUDE`, `$BUILD` instead).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..release.digest import sha256_file

__all__ = ["SCHEMA", "read", "sha256_file", "source_files", "source_hash", "write"]

SCHEMA = 1
# What can change the build: C, assembler, headers, the hook table. Tests and editor junk cannot.
SOURCE_SUFFIXES = (".c", ".h", ".S", ".s", ".def", ".inc", ".map", ".lds")


def source_files(src_dir: Path) -> list[Path]:
    """Every file under src_dir that can affect the build, as sorted relative paths (tests/ excluded)."""
    out = []
    for root, dirs, files in os.walk(src_dir):
        rel_root = Path(root).relative_to(src_dir)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not (rel_root == Path(".") and d == "tests"))
        for name in files:
            if not name.startswith(".") and name.endswith(SOURCE_SUFFIXES):
                out.append(rel_root / name)
    return sorted(out, key=lambda p: p.as_posix())


def source_hash(src_dir: Path, files: Iterable[Path] | None = None) -> str:
    """sha256 over each file's relative path and contents, in sorted order (length-prefixed)."""
    h = hashlib.sha256()
    for rel in files if files is not None else source_files(src_dir):
        data = (src_dir / rel).read_bytes()
        name = rel.as_posix().encode()
        h.update(len(name).to_bytes(8, "big") + name + len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


def write(path: Path, manifest: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())
