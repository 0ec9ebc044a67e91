#!/usr/bin/env python3
"""Write every shell script the tool sends to a node into DIR, for shellcheck.

The scripts are generated (deploy/facts.py's probe, deploy/swap.py's swap), so they are captured
from a real run: deploy LIBRARY to a fake node root whose live file is a copy of VENDOR, then roll
back, over a local transport that records each command before running it.

    python3 .ci/shipped_shell.py DIR LIBRARY VENDOR
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from vgpu_patch.deploy.swap import deploy_file, node_status, rollback
from vgpu_patch.transport.base import Result
from vgpu_patch.transport.local import LocalTransport


class Recording(LocalTransport):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.scripts: list[str] = []

    def run(self, cmd: str, *, sudo: bool = False, warn: bool = False, timeout: float | None = None) -> Result:
        self.scripts.append(cmd)
        return super().run(cmd, sudo=sudo, warn=warn, timeout=timeout)


def main(out: Path, library: Path, vendor: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vgpu-shell-") as tmp:
        lib_dir = Path(tmp) / "usr/local/vgpu"
        lib_dir.mkdir(parents=True)
        shutil.copyfile(vendor, lib_dir / "libvgpu.so")
        t = Recording(Path(tmp))
        deploy_file(t, library, operator="ci", dry_run=False)
        node_status(t)
        rollback(t, operator="ci")
    seen: set[str] = set()
    for i, script in enumerate(s for s in t.scripts if not (s in seen or seen.add(s))):  # type: ignore[func-returns-value]
        (out / f"{i:02d}.sh").write_text("#!/bin/sh\n" + script + "\n")
    print(f"{len(seen)} distinct scripts written to {out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))
