#!/bin/sh
# Build the agent image for linux/amd64 and linux/arm64, each carrying its own shim build, under one tag.
#   deploy/build-multiarch.sh registry.example.com/vgpu-patch-agent:0.1.0 [--push]
# Each architecture's shim is built with `vgpu-patch build --arch` (zig cross-compiles, any host), checked,
# and copied into a per-arch build context whose out/ holds only that build; deploy/Dockerfile is used
# unchanged. BUILDER=docker (default; docker buildx, QEMU/binfmt for the foreign arch) or BUILDER=buildah.
# Without --push the per-arch images stay local (docker: loaded; buildah: in a local manifest list).
set -eu
IMAGE=${1:?usage: $0 IMAGE[:TAG] [--push]}
PUSH=${2:-}
BUILDER=${BUILDER:-docker}
GLIBC=${GLIBC:-2.28}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

arch_of() { case "$1" in amd64) echo x86_64 ;; arm64) echo aarch64 ;; *) echo "unknown arch $1" >&2; exit 2 ;; esac; }

for a in amd64 arm64; do
  ctx="$WORK/$a"
  mkdir -p "$ctx/out" "$ctx/deploy"
  vgpu-patch build --arch "$(arch_of "$a")" --glibc "$GLIBC" -o "$ctx/out/"
  cp -R "$ROOT/pyproject.toml" "$ROOT/README.md" "$ROOT/vgpu_patch" "$ctx/"
  cp "$ROOT/deploy/Dockerfile" "$ctx/deploy/"
  case "$BUILDER" in
    docker)
      if [ "$PUSH" = --push ]; then out=--push; else out=--load; fi
      docker buildx build --platform "linux/$a" -f "$ctx/deploy/Dockerfile" -t "$IMAGE-$a" "$out" "$ctx" ;;
    buildah)
      buildah build --storage-driver vfs --isolation chroot --platform "linux/$a" -f "$ctx/deploy/Dockerfile" \
        -t "$IMAGE-$a" "$ctx" ;;
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
