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


def test_the_role_ships_the_package_files_themselves() -> None:
    """No generated copies: the role's node program (its live-file and rollback rules included) is the package's
    own file."""
    files = ANSIBLE_DIR / "roles" / "vgpu_patch" / "files"
    pkg = ANSIBLE_DIR.parent / "vgpu_patch"
    assert (files / "node.sh").resolve() == (pkg / "data" / "node.sh").resolve()
    assert sorted(p.name for p in files.iterdir()) == ["node.sh"]
