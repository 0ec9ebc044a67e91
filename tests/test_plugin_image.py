"""`vgpu-patch plugin-image`: the Containerfile and build command it derives, its refusals, and status telling
that the device plugin itself delivered our library (the image's manifest beside the live file)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from node_fixtures import build_marked_lib, sha

from vgpu_patch.k8s.plugin_image import PluginImageError, default_tag, version_from_listing

REPO = Path(__file__).resolve().parent.parent


def vgpu(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vgpu_patch.cli", *args], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, timeout=120)


@pytest.fixture
def ours(tmp_path: Path) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed")
    lib = build_marked_lib(tmp_path / "libvgpu.so", "vgpu-patch-shim 0.3.0", 3)
    (tmp_path / "libvgpu.so.json").write_text(json.dumps({"sha256": sha(lib)}))
    return lib


def test_dry_run_prints_the_containerfile_and_the_build(ours: Path) -> None:
    res = vgpu("plugin-image", "--from", "projecthami/hami:v2.6.0", "--library", str(ours), "--version", "v2.6.0",
               "--builder", "buildah", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "FROM ${BASE}" in res.stdout
    assert "COPY libvgpu.so /k8s-vgpu/lib/nvidia/libvgpu.so.${VERSION}" in res.stdout
    assert "COPY vgpu-patch-manifest.json /k8s-vgpu/lib/nvidia/vgpu-patch-manifest.json" in res.stdout
    assert ("# buildah bud --build-arg BASE=projecthami/hami:v2.6.0 --build-arg VERSION=v2.6.0 --build-arg "
            f"SHA256={sha(ours)} --build-arg OURS=0.3.0 -t projecthami/hami:v2.6.0-vgpu-patch-0.3.0") in res.stdout
    doc = json.loads(vgpu("plugin-image", "--from", "hami", "--library", str(ours), "--dry-run", "--json").stdout)
    assert doc["tag"] == "hami:vgpu-patch-0.3.0" and doc["version"] is None and "<read from image>" in " ".join(
        doc["build"])


def test_a_library_without_its_manifest_is_refused(ours: Path) -> None:
    ours.with_name("libvgpu.so.json").unlink()
    res = vgpu("plugin-image", "--from", "hami:v2.6.0", "--library", str(ours), "--dry-run")
    assert res.returncode == 1 and "no expected sha256" in res.stderr


def test_a_builder_that_cannot_build_fails_in_one_line(ours: Path, tmp_path: Path) -> None:
    if shutil.which("docker") is None:
        pytest.skip("no docker client")
    sock = f"unix://{tmp_path}/no-daemon.sock"  # a daemon that is not there: the real client's own error
    res = vgpu("plugin-image", "--from", "hami:v2.6.0", "--library", str(ours), "--version", "v2.6.0",
               "--builder", "docker", env={"DOCKER_HOST": sock})
    assert res.returncode == 1
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("vgpu-patch: error: hami:v2.6.0: `docker build --build-arg BASE=hami:v2.6.0")
    assert "failed (exit 1)" in line


@pytest.mark.parametrize(("listing", "version"), [
    ("libvgpu.so.v2.6.0\nld.so.preload\n", "v2.6.0"),
    ("libvgpu.so.2.6.0\nlibvgpu.so.2.6.0.bak\n", "2.6.0"),
    ("libvgpu.so.v2.7.0-rc1\n", "v2.7.0-rc1"),
])
def test_the_plugin_version_from_its_library_dir(listing: str, version: str) -> None:
    assert version_from_listing(listing, "img") == version


@pytest.mark.parametrize("listing", ["", "libvgpu.so\n", "libvgpu.so.v2.5.0\nlibvgpu.so.v2.6.0\n"])
def test_no_single_version_is_refused(listing: str) -> None:
    with pytest.raises(PluginImageError, match="pass --version"):
        version_from_listing(listing, "img")


@pytest.mark.parametrize(("base", "tag"), [
    ("projecthami/hami:v2.6.0", "projecthami/hami:v2.6.0-vgpu-patch-0.3.0"),
    ("registry:5000/hami", "registry:5000/hami:vgpu-patch-0.3.0"),
    ("hami@sha256:" + "a" * 64, "hami:vgpu-patch-0.3.0"),
])
def test_default_tag(base: str, tag: str) -> None:
    assert default_tag(base, "0.3.0") == tag


def test_status_knows_the_plugin_delivered_our_library(ours: Path, tmp_path: Path) -> None:
    root = tmp_path / "node"
    d = root / "usr/local/vgpu"
    d.mkdir(parents=True)
    vendor = build_marked_lib(tmp_path / "vendor.so", "HAMi-core vendor", 7)
    shutil.copyfile(vendor, d / "libvgpu.so.v2.6.0")
    assert vgpu("deploy", "--local", str(root), "--no-check", str(vendor.with_name("vendor.so"))).returncode == 0
    # what the plugin's vgpu-init.sh does with the derived image: copy its files over the host's
    shutil.copyfile(ours, d / "libvgpu.so.v2.6.0")
    shutil.copyfile(ours.with_name("libvgpu.so.json"), d / "vgpu-patch-manifest.json")
    res = vgpu("status", "--local", str(root), "--json")
    node = json.loads(res.stdout)["nodes"][0]["result"]
    assert res.returncode == 0, res.stdout
    assert node["delivered_by_plugin"] and not node["replaced_outside"] and node["problem"] is None
    assert node["ours"] and node["version"] == "0.3.0" and node["other_files"] == []
