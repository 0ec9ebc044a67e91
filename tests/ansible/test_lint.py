"""ansible-lint (production profile, offline) is clean; it also runs ansible-playbook --syntax-check."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from fleet_helpers import ANSIBLE_DIR

PLAYBOOKS = ["deploy.yml", "rollback.yml", "status.yml"]


def test_ansible_lint_production_profile() -> None:
    env = {**os.environ, "NO_COLOR": "1", "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"),
           "ANSIBLE_LOCALHOST_WARNING": "false", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false"}
    if shutil.which("ansible-lint") is None:
        if shutil.which("ansible-playbook") is None:
            pytest.skip("neither ansible-lint nor ansible-playbook is installed (pip install ansible-lint)")
        proc = subprocess.run(["ansible-playbook", "--syntax-check", "-i", "inventory.example.ini", *PLAYBOOKS],
                              cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        pytest.skip("ansible-lint is not installed (pip install ansible-lint); syntax check passed")
    proc = subprocess.run(["ansible-lint", "--offline", "--profile", "production", "--nocolor"],
                          cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_role_scripts_are_generated_from_the_cli_steps(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The role runs the CLI's own swap steps: its copies must be what script.py generates now."""
    import sys

    proc = subprocess.run([sys.executable, "-m", "vgpu_patch.deploy.script", str(tmp_path)], capture_output=True,
                          text=True, cwd=ANSIBLE_DIR.parent, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for action in ("deploy", "rollback"):
        name = f"vgpu-patch-{action}.sh"
        fresh = (tmp_path / name).read_text()
        assert (ANSIBLE_DIR / "roles" / "vgpu_patch" / "files" / name).read_text() == fresh, (
            f"{name} is stale: run python3 -m vgpu_patch.deploy.script")
