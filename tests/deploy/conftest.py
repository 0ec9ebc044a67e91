"""Fixtures for the deploy tests: real sshd servers (tests/sshd_harness.py) and small real .so files."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from deploy_support import build_lib
from sshd_harness import SSHD, HarnessUnavailable, available

TEST_USER = "vgpudeploy"


def _need_sshd() -> None:
    reason = available()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def sshd_root(tmp_path_factory: pytest.TempPathFactory):
    """An sshd that logs in the current user (root in CI)."""
    _need_sshd()
    with SSHD(tmp_path_factory.mktemp("sshd-root")) as server:
        yield server


@pytest.fixture(scope="session")
def sshd_sudo(tmp_path_factory: pytest.TempPathFactory):
    """An sshd logging in a non-root user whose sudo rule allows only `sh`, with requiretty (root only)."""
    _need_sshd()
    if os.geteuid() != 0:
        pytest.skip("needs root (creates a unix user and a sudoers rule)")
    try:
        server = SSHD(
            tmp_path_factory.mktemp("sshd-sudo"), user=TEST_USER, create_user=True, sudo=True, requiretty=True
        )
    except HarnessUnavailable as e:
        pytest.skip(str(e))
    with server:
        yield server


@pytest.fixture(scope="session")
def sshd_nosudo(tmp_path_factory: pytest.TempPathFactory):
    """An sshd logging in a non-root user with no sudo rights at all (root only)."""
    _need_sshd()
    if os.geteuid() != 0:
        pytest.skip("needs root (creates a unix user)")
    try:
        server = SSHD(tmp_path_factory.mktemp("sshd-nosudo"), user="vgpunosudo", create_user=True, sudo=False)
    except HarnessUnavailable as e:
        pytest.skip(str(e))
    with server:
        yield server


@pytest.fixture()
def fresh_sshd(tmp_path: Path):
    """A throwaway sshd for tests that kill sessions or rotate keys.

    As root it logs in TEST_USER (shell /bin/sh, sudo): killing a root session could interrupt whatever
    root's ~/.bashrc runs at login (on dev boxes, `pyenv init` holding a lock) and stall later logins.
    """
    _need_sshd()
    kw = dict(user=TEST_USER, create_user=True, sudo=True, requiretty=True) if os.geteuid() == 0 else {}
    try:
        server = SSHD(tmp_path / "sshd", **kw)  # type: ignore[arg-type]
    except HarnessUnavailable as e:
        pytest.skip(str(e))
    with server:
        yield server


@pytest.fixture(scope="session")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """vendor (not ours), v1 and v2 (ours), v3 (ours), all different bytes."""
    d = tmp_path_factory.mktemp("libs")
    return {
        "vendor": build_lib(d / "vendor.so", 7, ours=False),
        "v1": build_lib(d / "v1.so", 1),
        "v2": build_lib(d / "v2.so", 2),
        "v3": build_lib(d / "v3.so", 3),
    }
