"""The sshd harness's exit cleanup removes only the sudoers rules this process created."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import sshd_harness as H

pytestmark = pytest.mark.skipif(shutil.which("visudo") is None, reason="needs visudo (the sudo package)")


@pytest.fixture
def rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(H, "_sudoers_path", lambda user: tmp_path / f"vgpu-patch-test-{user}")
    monkeypatch.setattr(H, "_ORIGINAL_SUDOERS", {})
    return tmp_path


def test_a_rule_it_created_is_removed(rules: Path) -> None:
    path = H._write_sudoers("alice", requiretty=False)
    assert path.exists()
    H._restore_sudoers()
    assert not path.exists()


def test_a_rule_it_found_is_left_alone(rules: Path) -> None:
    H._write_sudoers("bob", requiretty=False)
    found = (rules / "vgpu-patch-test-bob").read_text()
    H._ORIGINAL_SUDOERS.clear()  # as if another run had written it
    H._write_sudoers("bob", requiretty=False)
    H._restore_sudoers()
    assert (rules / "vgpu-patch-test-bob").read_text() == found


def test_a_rule_it_changed_or_removed_is_put_back(rules: Path) -> None:
    path = rules / "vgpu-patch-test-carol"
    original = "carol ALL=(root) NOPASSWD: /bin/true\n"
    path.write_text(original)
    H._write_sudoers("carol", requiretty=True)
    assert "requiretty" in path.read_text()
    H._restore_sudoers()
    assert path.read_text() == original
    H._ORIGINAL_SUDOERS.clear()
    H._remove_sudoers("carol")
    assert not path.exists()
    H._restore_sudoers()
    assert path.read_text() == original
