"""deploy/build-multiarch.sh: one tag for linux/amd64 and linux/arm64, each image carrying its own shim build.

Run with stand-ins for `vgpu-patch` and `docker`/`buildah` on PATH that record their arguments and what each
build context holds, so the recipe is checked without a container engine or QEMU.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "build-multiarch.sh"

FAKE_VGPU = """#!/bin/sh
# vgpu-patch build --arch A --glibc G -o DIR: write a stand-in library naming its arch
echo "vgpu-patch $*" >> "$LOG"
while [ $# -gt 0 ]; do case "$1" in --arch) a=$2; shift 2;; -o) o=$2; shift 2;; *) shift;; esac; done
mkdir -p "$o"; printf 'shim for %s\\n' "$a" > "$o/libvgpu.so"; printf '{"arch": "%s"}\\n' "$a" > "$o/libvgpu.so.json"
"""
FAKE_ENGINE = """#!/bin/sh
# record the call and, for a build, the library its context carries
echo "$(basename "$0") $*" >> "$LOG"
for last; do :; done
if [ -f "$last/out/libvgpu.so" ]; then echo "context $(cat "$last/out/libvgpu.so")" >> "$LOG"; fi
[ -f "$last/deploy/Dockerfile" ] && [ -d "$last/vgpu_patch" ] && echo "context has Dockerfile and package" >> "$LOG"
true
"""


def run(tmp_path: Path, builder: str, *args: str) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("vgpu-patch", FAKE_VGPU), ("docker", FAKE_ENGINE), ("buildah", FAKE_ENGINE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / f"{builder}.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG": str(log), "BUILDER": builder}
    subprocess.run(["sh", str(SCRIPT), "reg.example/vgpu-patch-agent:0.1.0", *args], env=env, check=True,
                   capture_output=True, text=True)
    return log.read_text().splitlines()


def test_docker_buildx_recipe(tmp_path: Path) -> None:
    lines = run(tmp_path, "docker", "--push")
    builds = [ln for ln in lines if ln.startswith("vgpu-patch build")]
    assert [b.split("--arch ")[1].split()[0] for b in builds] == ["x86_64", "aarch64"]
    assert all("--glibc 2.28" in b for b in builds)
    buildx = [ln for ln in lines if ln.startswith("docker buildx build")]
    assert ["--platform linux/amd64" in buildx[0], "--platform linux/arm64" in buildx[1]] == [True, True]
    contexts = [ln for ln in lines if ln.startswith("context shim")]
    assert contexts == ["context shim for x86_64", "context shim for aarch64"]  # each image its own build
    assert lines.count("context has Dockerfile and package") == 2
    assert lines[-1] == ("docker buildx imagetools create -t reg.example/vgpu-patch-agent:0.1.0 "
                         "reg.example/vgpu-patch-agent:0.1.0-amd64 reg.example/vgpu-patch-agent:0.1.0-arm64")


def test_buildah_recipe(tmp_path: Path) -> None:
    lines = run(tmp_path, "buildah")
    assert sum("--platform linux/arm64" in ln and "--isolation chroot" in ln for ln in lines) == 1
    assert any(ln.startswith("buildah --storage-driver vfs manifest create") for ln in lines)
    assert sum("manifest add" in ln for ln in lines) == 2 and not any("manifest push" in ln for ln in lines)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shellcheck() -> None:
    subprocess.run(["shellcheck", "-s", "sh", str(SCRIPT)], check=True)
