"""The README's end-to-end demo on a fake node root: build, check, deploy, status, rollback.

The fake node starts with a stand-in for the vendor library (same exported surface plus the internals
the vendor build leaks, as trivial functions), so the demo shows a real vendor -> ours -> vendor cycle
without needing HAMi's binary.
"""
from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from ..elf.reference import reference_surface
from ..report.errors import BuildError
from . import toolchain

VENDOR_DIR = "usr/local/vgpu"


def _standin_source() -> str:
    ref = reference_surface()
    lines = ['const char vgpu_vendor_standin[] = "HAMi-core vendor stand-in (demo)";']
    for name in sorted(ref.surface | ref.internal):
        lines.append(f"int {name}(void) {{ return 999; }}")
    return "\n".join(lines) + "\n"


def make_vendor_standin(out: Path, *, compiler: str | None = None) -> Path:
    """Compile the stand-in vendor library to `out` with the same toolchain choice as `build`."""
    tc = toolchain.resolve(compiler, None, toolchain.DEFAULT_FLOOR)
    with tempfile.TemporaryDirectory(prefix="vgpu-demo-") as tmp:
        src = Path(tmp) / "standin.c"
        src.write_text(_standin_source())
        argv = tc.argv + tc.target_args + ["-shared", "-fPIC", "-O1", "-w", "-o", str(out), str(src)]
        proc = subprocess.run(argv, capture_output=True, text=True, env=tc.env(Path(tmp)))
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or ["no output"])[0]
        raise BuildError(f"could not compile the demo's vendor stand-in with {tc.name}: {first}")
    return out


def prepare_node(root: Path, *, compiler: str | None = None) -> Path:
    """A fake node root whose /usr/local/vgpu/libvgpu.so is the vendor stand-in; returns the live path."""
    lib_dir = root / VENDOR_DIR
    lib_dir.mkdir(parents=True, exist_ok=True)
    live = lib_dir / "libvgpu.so"
    if not live.exists():
        make_vendor_standin(live, compiler=compiler)
        live.chmod(0o755)
    return live
