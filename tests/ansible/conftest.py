"""Fixtures for the Ansible tests: real ansible-playbook against real sshd nodes on 127.0.0.1."""
from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_helpers import LOGIN, Libs, Node, build_lib
from sshd_harness import SSHD, available, start_many


@pytest.fixture(scope="session")
def libs(tmp_path_factory: pytest.TempPathFactory) -> Libs:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the test libraries")
    d = tmp_path_factory.mktemp("libs")
    bad = d / "not-elf.so"
    bad.write_bytes(b"this is not an ELF shared object\n" * 64)
    return Libs(
        vendor=build_lib(d, "vendor.so", "HAMi-core vendor build", 0),
        v1=build_lib(d, "v1.so", "vgpu-patch-shim 0.1.0", 1),
        v2=build_lib(d, "v2.so", "vgpu-patch-shim 0.2.0", 2),
        not_elf=bad,
    )


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[SSHD]]:
    reason = available()
    if reason or shutil.which("ansible-playbook") is None:
        pytest.skip(reason or "ansible-playbook is not installed (pip install ansible-core)")
    fleet = start_many(3, tmp_path_factory.mktemp("sshd"), **LOGIN)
    try:
        yield fleet
    finally:
        for s in fleet:
            s.stop()


@pytest.fixture
def nodes(servers: list[SSHD], tmp_path: Path) -> list[Node]:
    """The module's sshd fleet, each with a fresh, empty node root for this test."""
    out = []
    for i, s in enumerate(servers):
        node = Node(s, tmp_path / f"root{i}")
        node.libdir.mkdir(parents=True)
        out.append(node)
    return out


