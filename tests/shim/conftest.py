"""The shim scenarios' environment over the session's shim and fake driver (built in tests/conftest.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from .harness import Env


@pytest.fixture()
def env(shim_path: Path, fake_dir: Path, tmp_path: Path) -> Env:
    return Env(shim_path, fake_dir, tmp_path)
