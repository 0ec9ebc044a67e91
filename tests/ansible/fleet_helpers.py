"""Helpers for the Ansible tests: real ansible-playbook against real sshd nodes on 127.0.0.1.

Each node is an sshd from tests/sshd_harness.py; its "root" is a tmp dir and the role's
vgpu_patch_target_dir points at <root>/usr/local/vgpu. The test libraries are tiny real shared
objects built with gcc, so the role's LD_PRELOAD load test runs for real.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "ansible"
sys.path.insert(0, str(REPO / "tests"))

from node_fixtures import NodeRoot, build_marked_lib  # noqa: E402
from sshd_harness import SSHD  # noqa: E402

# As root (CI), log in as an unprivileged user and become root through sudo, as on real nodes. That user's
# login shell is /bin/sh: root's ~/.bashrc here runs `pyenv rehash` on every SSH command, which is slow
# and can wait up to 60 s on pyenv's lock.
LOGIN: dict = {"user": "vgpuansible", "create_user": True, "sudo": True} if os.geteuid() == 0 else {}
BECOME = bool(LOGIN)

_RECAP_RE = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


@dataclass
class Libs:
    vendor: Path  # stands for HAMi's own libvgpu.so
    v1: Path  # our build, version 1
    v2: Path  # our build, version 2
    not_elf: Path  # garbage named .so: the load test must refuse it


class Node(NodeRoot):
    """A fake node root reached through its own sshd."""

    def __init__(self, sshd: SSHD, root: Path) -> None:
        super().__init__(root)
        self.sshd = sshd

    @property
    def name(self) -> str:
        return self.sshd.alias


@dataclass
class Run:
    rc: int
    output: str
    recap: dict[str, dict[str, int]]

    def changed(self, node: Node) -> int:
        return self.recap[node.name]["changed"]

    def failed(self, node: Node) -> int:
        return self.recap[node.name]["failed"]


def build_lib(src_dir: Path, name: str, marker: str, version: int) -> Path:
    return build_marked_lib(src_dir / name, marker, version)


def write_inventory(nodes: list[Node], path: Path, host_vars: dict[str, dict] | None = None) -> Path:
    """An INI inventory: group `gpu` in the given order (the first node is the canary)."""
    lines = ["[gpu]"]
    for n in nodes:
        extra = {"vgpu_patch_target_dir": str(n.libdir), "ansible_python_interpreter": sys.executable}
        extra.update((host_vars or {}).get(n.name, {}))
        kv = " ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else _ini_quote(v)}" for k, v in extra.items())
        lines.append(f"{n.name} {n.sshd.inventory_vars()} {kv}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _ini_quote(v: str) -> str:
    return "'" + v.replace("'", "\\'") + "'" if re.search(r"\s|'", v) else v


def run_playbook(playbook: str, inventory: Path, extra: dict | None = None, limit: str | None = None,
                 env_extra: dict[str, str] | None = None) -> Run:
    """ansible-playbook from ansible/, as a user would run it; returns rc, output and the PLAY RECAP."""
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_DISPLAY_SKIPPED_HOSTS": "false",
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
        "ANSIBLE_ROLES_PATH": str(ANSIBLE_DIR / "roles"),  # for test playbooks outside ansible/
        **(env_extra or {}),
    }
    args = {"vgpu_patch_become": BECOME, **(extra or {})}
    cmd = ["ansible-playbook", "-i", str(inventory), playbook, "-e", json.dumps(args)]
    if limit:
        cmd += ["--limit", limit]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=300)
    if os.environ.get("VGPU_TEST_TIMING"):  # where the Ansible tests' time goes
        print(f"{playbook} {limit or ''}: {time.monotonic() - start:.1f}s", file=sys.stderr)
    out = proc.stdout + proc.stderr
    recap = {
        m.group(1): {"ok": int(m.group(2)), "changed": int(m.group(3)), "unreachable": int(m.group(4)),
                     "failed": int(m.group(5))}
        for m in _RECAP_RE.finditer(out)
    }
    return Run(proc.returncode, out, recap)
