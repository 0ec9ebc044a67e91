#!/bin/sh
# Build the agent image for linux/amd64 and linux/arm64, each carrying its own shim build, under one tag.
#   deploy/build-multiarch.sh registry.example.com/vgpu-patch-agent:0.1.0 [--push]
# Each architecture's shim is built with `vgpu-patch build --arch` (zig cross-compiles, any host), checked,
# and copied into a per-arch build context whose out/ holds only that build, with a wheelhouse of the tool
# and the agent's pinned dependencies (deploy/agent-constraints.txt: no paramiko) for that architecture
# (CPython 3.11, glibc 2.28 or newer: Debian 12); deploy/Dockerfile is used unchanged. BUILDER=docker (default; docker buildx,
# QEMU/binfmt for the foreign arch) or BUILDER=buildah. BASE_IMAGE, when set, is passed as the build
# argument (a manifest list, so that each platform gets its own base). Without --push the per-arch images
# stay local (docker: loaded; buildah: in a local manifest list).
set -eu
IMAGE=${1:?usage: $0 IMAGE[:TAG] [--push]}
PUSH=${2:-}
BUILDER=${BUILDER:-docker}
GLIBC=${GLIBC:-2.28}
PYTHON=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

arch_of() { case "$1" in amd64) echo x86_64 ;; arm64) echo aarch64 ;; *) echo "unknown arch $1" >&2; exit 2 ;; esac; }

# the tool's own wheel (pure Python), built from a copy so that the checkout gets no build/ or egg-info
mkdir -p "$WORK/src"
cp -R "$ROOT/pyproject.toml" "$ROOT/README.md" "$ROOT/LICENSE" "$ROOT/vgpu_patch" "$ROOT/c_src" "$WORK/src/"
"$PYTHON" -m pip wheel -q --no-deps -w "$WORK/wheel" "$WORK/src"

set --  # the engine's extra arguments
if [ -n "${BASE_IMAGE:-}" ]; then set -- --build-arg "BASE_IMAGE=$BASE_IMAGE"; fi

for a in amd64 arm64; do
  ctx="$WORK/$a"
  mkdir -p "$ctx/out/wheels" "$ctx/deploy"
  m=$(arch_of "$a")
  vgpu-patch build --arch "$m" --glibc "$GLIBC" -o "$ctx/out/"
  cp "$WORK"/wheel/*.whl "$ctx/out/wheels/"
  # the agent's own dependencies (no paramiko: the image installs the tool with --no-deps)
  "$PYTHON" -m pip download -q --only-binary=:all: --python-version 3.11 --implementation cp \
    --platform "manylinux_2_34_$m" --platform "manylinux_2_28_$m" --platform "manylinux2014_$m" \
    -d "$ctx/out/wheels" -r "$ROOT/deploy/agent-constraints.txt"
  cp "$ROOT/deploy/Dockerfile" "$ROOT/deploy/agent-constraints.txt" "$ctx/deploy/"
  cp "$ROOT/.dockerignore" "$ctx/"
  case "$BUILDER" in
    docker)
      if [ "$PUSH" = --push ]; then out=--push; else out=--load; fi
      docker buildx build --platform "linux/$a" "$@" -f "$ctx/deploy/Dockerfile" -t "$IMAGE-$a" "$out" "$ctx" ;;
    buildah)
      buildah build --storage-driver vfs --isolation chroot --platform "linux/$a" "$@" \
        -f "$ctx/deploy/Dockerfile" -t "$IMAGE-$a" "$ctx" ;;
    *) echo "BUILDER must be docker or buildah" >&2; exit 2 ;;
  esac
done

case "$BUILDER" in
  docker)
    if [ "$PUSH" = --push ]; then
      docker buildx imagetools create -t "$IMAGE" "$IMAGE-amd64" "$IMAGE-arm64"
    else
      echo "built $IMAGE-amd64 and $IMAGE-arm64 locally; rerun with --push to publish $IMAGE as one multi-arch tag"
    fi ;;
  buildah)
    buildah --storage-driver vfs manifest create "$IMAGE"
    for a in amd64 arm64; do buildah --storage-driver vfs manifest add "$IMAGE" "containers-storage:$IMAGE-$a"; done
    if [ "$PUSH" = --push ]; then buildah --storage-driver vfs manifest push --all "$IMAGE" "docker://$IMAGE"; fi ;;
esac
