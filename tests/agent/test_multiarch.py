"""deploy/build-multiarch.sh: one tag for linux/amd64 and linux/arm64, each image carrying its own shim build.

Run with stand-ins for `vgpu-patch`, `docker`/`buildah` and pip (PYTHON) that record their arguments and what
each build context holds, so the recipe is checked without a container engine, QEMU or an index. A real
build of both images with buildah is described in docs/fleet.md ("A multi-arch image").
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
FAKE_PYTHON = """#!/bin/sh
# PYTHON -m pip wheel ... -w DIR SRC | PYTHON -m pip download ... --platform P ... -d DIR WHEEL: stand-in wheels
echo "python $*" >> "$LOG"
p=
while [ $# -gt 0 ]; do
  case "$1" in -w|-d) d=$2; shift 2;; --platform) p=${p:-$2}; shift 2;; *) last=$1; shift;; esac
done
mkdir -p "$d"
if [ -z "$p" ]; then [ -f "$last/pyproject.toml" ] && : > "$d/vgpu_patch-0.1.0-py3-none-any.whl"
else : > "$d/PyYAML-6.0.4-cp311-cp311-$p.whl"; fi
"""
FAKE_ENGINE = """#!/bin/sh
# record the call and, for a build, the library and the wheels its context carries
echo "$(basename "$0") $*" >> "$LOG"
for last; do :; done
if [ -f "$last/out/libvgpu.so" ]; then echo "context $(cat "$last/out/libvgpu.so")" >> "$LOG"; fi
if [ -d "$last/out/wheels" ]; then echo "wheels $(cd "$last/out/wheels" && echo *.whl)" >> "$LOG"; fi
[ -f "$last/deploy/Dockerfile" ] && [ -f "$last/deploy/agent-constraints.txt" ] && [ -f "$last/.dockerignore" ] \\
  && echo "context has Dockerfile, pins and .dockerignore" >> "$LOG"
true
"""


def run(tmp_path: Path, builder: str, *args: str, **env_extra: str) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("vgpu-patch", FAKE_VGPU), ("docker", FAKE_ENGINE), ("buildah", FAKE_ENGINE),
                       ("fake-python", FAKE_PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / f"{builder}.log"
    env = {k: v for k, v in os.environ.items() if k != "BASE_IMAGE"}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", LOG=str(log), BUILDER=builder,
               PYTHON=str(bin_dir / "fake-python"), **env_extra)
    subprocess.run(["sh", str(SCRIPT), "reg.example/vgpu-patch-agent:0.1.0", *args], env=env, check=True,
                   capture_output=True, text=True, timeout=60)
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
    assert lines.count("context has Dockerfile, pins and .dockerignore") == 2
    # one wheel of the tool, then each context's dependencies downloaded for its own architecture
    pip = [ln for ln in lines if ln.startswith("python -m pip")]
    assert [ln.split()[3] for ln in pip] == ["wheel", "download", "download"]
    assert "--platform manylinux_2_34_x86_64" in pip[1] and "--platform manylinux_2_34_aarch64" in pip[2]
    # the agent's pins only (-r), not the tool's dependencies: no paramiko in the image
    assert all(ln.endswith("-r " + str(REPO / "deploy" / "agent-constraints.txt")) and "--only-binary=:all:" in ln
               for ln in pip[1:])
    assert [ln for ln in lines if ln.startswith("wheels ")] == [
        f"wheels PyYAML-6.0.4-cp311-cp311-manylinux_2_34_{m}.whl vgpu_patch-0.1.0-py3-none-any.whl"
        for m in ("x86_64", "aarch64")]
    assert not any("BASE_IMAGE" in ln for ln in buildx)  # the Dockerfile's pinned default
    assert lines[-1] == ("docker buildx imagetools create -t reg.example/vgpu-patch-agent:0.1.0 "
                         "reg.example/vgpu-patch-agent:0.1.0-amd64 reg.example/vgpu-patch-agent:0.1.0-arm64")


def test_buildah_recipe(tmp_path: Path) -> None:
    lines = run(tmp_path, "buildah", BASE_IMAGE="localhost/debian-bookworm-python3:12")
    builds = [ln for ln in lines if ln.startswith("buildah build")]
    assert len(builds) == 2 and all("--build-arg BASE_IMAGE=localhost/debian-bookworm-python3:12" in ln
                                    for ln in builds)
    assert sum("--platform linux/arm64" in ln and "--isolation chroot" in ln for ln in lines) == 1
    assert any(ln.startswith("buildah --storage-driver vfs manifest create") for ln in lines)
    assert sum("manifest add" in ln for ln in lines) == 2 and not any("manifest push" in ln for ln in lines)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shellcheck() -> None:
    subprocess.run(["shellcheck", "-s", "sh", str(SCRIPT)], check=True)
