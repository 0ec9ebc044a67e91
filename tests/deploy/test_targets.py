"""Target specs: --host forms and Ansible INI/YAML inventories with groups, vars and --limit
(test_inventory.py compares a whole corpus with ansible's own answers)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from vgpu_patch.deploy.inventory import load_inventory
from vgpu_patch.deploy.targets import parse_host
from vgpu_patch.report.errors import UsageError

INI = """
# a typical GPU fleet
bastion ansible_host=10.0.0.1

[gpu]
gpu-[01:03] ansible_user=admin
gpu-big ansible_host=10.0.0.50 ansible_port=2222 vgpu_target_dir=/opt/vgpu

[gpu:vars]
ansible_ssh_private_key_file=~/.ssh/fleet
ansible_ssh_common_args='-o ProxyJump=ops@bastion'

[cpu]
cpu-01

[cluster:children]
gpu
cpu

[all:vars]
ansible_user=root
"""

YAML = """
all:
  vars:
    ansible_user: root
  children:
    gpu:
      vars:
        ansible_ssh_private_key_file: /keys/fleet
      hosts:
        gpu-01:
        gpu-02:
          ansible_host: 10.0.0.2
          ansible_port: 2200
          ansible_user: admin
    cpu:
      hosts:
        cpu-01:
"""


@pytest.mark.parametrize(
    "text,host,user,port",
    [("admin@gpu-1:2222", "gpu-1", "admin", 2222), ("gpu-1", "gpu-1", None, None), ("r@[::1]:22", "::1", "r", 22)],
)
def test_parse_host(text: str, host: str, user: str | None, port: int | None) -> None:
    s = parse_host(text)
    assert (s.hostname, s.user, s.port) == (host, user, port)


@pytest.mark.parametrize("bad", ["a@b@c", "node:99999", "node:port", ""])
def test_parse_host_rejects(bad: str) -> None:
    with pytest.raises(UsageError, match="expected user@node"):
        parse_host(bad)


def test_ini_inventory(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.ini"
    inv.write_text(INI)
    specs = {s.name: s for s in load_inventory(inv)}
    assert set(specs) == {"bastion", "gpu-01", "gpu-02", "gpu-03", "gpu-big", "cpu-01"}
    assert specs["gpu-02"].user == "admin" and specs["gpu-02"].key_files == [os.path.expanduser("~/.ssh/fleet")]
    assert specs["gpu-02"].ssh_args == ["-o", "ProxyJump=ops@bastion"]  # handed to ssh -G as given
    big = specs["gpu-big"]
    assert (big.hostname, big.port, big.user, big.target_dir) == ("10.0.0.50", 2222, "root", "/opt/vgpu")
    assert specs["cpu-01"].user == "root" and specs["cpu-01"].ssh_args == []


@pytest.mark.parametrize(
    "limit,expected",
    [
        ("gpu", ["gpu-01", "gpu-02", "gpu-03", "gpu-big"]),
        ("gpu,!gpu-02", ["gpu-01", "gpu-03", "gpu-big"]),
        ("gpu-0*", ["gpu-01", "gpu-02", "gpu-03"]),
        ("cluster:!gpu", ["cpu-01"]),
        ("bastion", ["bastion"]),
    ],
)
def test_limit(tmp_path: Path, limit: str, expected: list[str]) -> None:
    inv = tmp_path / "hosts.ini"
    inv.write_text(INI)
    assert [s.name for s in load_inventory(inv, limit)] == expected


def test_limit_matching_nothing(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.ini"
    inv.write_text(INI)
    with pytest.raises(UsageError, match="no hosts match --limit nope"):
        load_inventory(inv, "nope")


def test_yaml_inventory(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text(YAML)
    specs = {s.name: s for s in load_inventory(inv, "gpu")}
    assert set(specs) == {"gpu-01", "gpu-02"}
    assert specs["gpu-01"].user == "root" and specs["gpu-01"].key_files == ["/keys/fleet"]
    assert (specs["gpu-02"].hostname, specs["gpu-02"].port, specs["gpu-02"].user) == ("10.0.0.2", 2200, "admin")
