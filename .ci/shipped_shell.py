#!/usr/bin/env python3
"""Write every shell script the tool sends to a node into DIR, for shellcheck.

The scripts are the node program (vgpu_patch/data/node.sh, also checked on its own) with the parameters and
calls of deploy/facts.py's probe and deploy/swap.py's swap, so they are captured
from real runs: deploy LIBRARY to a fake node root whose live file is a copy of VENDOR, then roll
back, over a local transport that records each command (and each script sent on a stream's stdin)
before running it; once in one session per node (streamed), once as separate runs (sudo with a
password or a terminal), with and without --stale-pids.

    python3 .ci/shipped_shell.py DIR LIBRARY VENDOR
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from vgpu_patch.deploy.facts import node_program
from vgpu_patch.deploy.swap import deploy_file, node_status, rollback
from vgpu_patch.transport.base import Result, Stream
from vgpu_patch.transport.local import LocalTransport


class Recording(LocalTransport):
    def __init__(self, root: Path, streams: bool) -> None:
        super().__init__(root)
        self.scripts: list[str] = []
        self.streams = streams

    def run(self, cmd: str, *, sudo: bool = False, warn: bool = False, timeout: float | None = None) -> Result:
        self.scripts.append(cmd)
        return super().run(cmd, sudo=sudo, warn=warn, timeout=timeout)

    def open_stream(self, cmd: str, *, sudo: bool = False, timeout: float | None = None) -> Stream | None:
        stream = super().open_stream(cmd, sudo=sudo, timeout=timeout) if self.streams else None
        if stream is None:
            return None
        self.scripts.append(cmd)
        send = stream.send

        def recording_send(data: bytes) -> None:
            if data.startswith(b"@@go "):  # `@@go N` and the N-byte script (the payload comes separately)
                head, _, rest = data.partition(b"\n")
                # it runs in the probe's shell, where node.sh already defined the functions it calls
                self.scripts.append(node_program() + "\n" + rest[: int(head.split()[1])].decode())
            send(data)

        stream.send = recording_send  # type: ignore[method-assign]
        return stream


def main(out: Path, library: Path, vendor: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    scripts: list[str] = []
    for streams in (True, False):
        for stale in (False, True):
            with tempfile.TemporaryDirectory(prefix="vgpu-shell-") as tmp:
                lib_dir = Path(tmp) / "usr/local/vgpu"
                lib_dir.mkdir(parents=True)
                shutil.copyfile(vendor, lib_dir / "libvgpu.so")
                t = Recording(Path(tmp), streams)
                deploy_file(t, library, operator="ci", dry_run=False, stale=stale)
                node_status(t)
                rollback(t, operator="ci", stale=stale)
                scripts += t.scripts
    seen: set[str] = set()
    for i, script in enumerate(s for s in scripts if not (s in seen or seen.add(s))):  # type: ignore[func-returns-value]
        (out / f"{i:02d}.sh").write_text("#!/bin/sh\n" + script + "\n")
    print(f"{len(seen)} distinct scripts written to {out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))
