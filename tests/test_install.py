"""Install hints name a command that works from where this copy came from (no package index has vgpu-patch).

.ci/run proves the wheel case for real: it runs the hint the core install's `build` prints, then builds with it.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from vgpu_patch import __version__
from vgpu_patch.release.install import EXTRAS, Origin, install_command

ROOT = Path(__file__).resolve().parents[1]


def test_extras_are_pyprojects() -> None:
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, packages in EXTRAS.items():
        assert list(packages) == extras[name], f"install.EXTRAS[{name!r}] differs from pyproject.toml"


def test_a_checkout_gets_an_editable_install_of_itself(tmp_path: Path) -> None:
    cmd = install_command("build", Origin("checkout", str(tmp_path / "src dir"), editable=True))
    assert cmd.endswith(f"-m pip install -e '{tmp_path}/src dir[build]'")
    assert cmd.startswith(sys.executable)  # this Python's pip, not the first on PATH


def test_a_wheel_gets_its_own_file(tmp_path: Path) -> None:
    whl = tmp_path / "vgpu_patch-0.1.0-py3-none-any.whl"
    whl.write_bytes(b"")
    assert install_command("build", Origin("wheel", str(whl))).endswith(f"-m pip install '{whl}[build]'")


def test_a_git_url_keeps_its_commit() -> None:
    cmd = install_command("inventory", Origin("git", "https://git.example.com/ops/vgpu-patch.git", "0123456789ab"))
    assert cmd.endswith("install 'vgpu-patch[inventory] @ git+https://git.example.com/ops/vgpu-patch.git@0123456789ab'")


@pytest.mark.parametrize("origin", [Origin("unknown", ""), Origin("wheel", "/nonexistent/gone.whl")])
def test_otherwise_the_extras_own_packages(origin: Origin) -> None:
    """Those are on PyPI: the one form that works whatever the source was."""
    cmd = install_command("build", origin)
    assert cmd.endswith("install 'ziglang>=0.13' 'nvidia-cuda-runtime>=12.0' 'nvidia-nvml-dev>=12.0'")
    assert "vgpu-patch[" not in cmd


def test_no_hint_sends_pip_to_an_index_for_vgpu_patch() -> None:
    """`pip install 'vgpu-patch[...]'` alone (no path, no URL) fails everywhere: no source may say it."""
    offenders = []
    for path in [*ROOT.glob("vgpu_patch/**/*.py"), *ROOT.glob("docs/*.md"), ROOT / "README.md",
                 *ROOT.glob("ansible/**/*.md"), *ROOT.glob("charts/**/*.txt"), *ROOT.glob("deploy/*")]:
        text = path.read_text(errors="replace") if path.is_file() else ""
        for m in re.finditer(r"pip install '?vgpu-patch(?:\[[a-z,]+\])?'?(?=[\s`'\"]|$)(?! @)", text):
            offenders.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
    assert not offenders


def test_version_says_the_commit_and_the_shim() -> None:
    out = subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "--version"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    first, shim = out.stdout.splitlines()
    assert first.startswith(f"vgpu-patch {__version__} (")
    assert f"checkout {ROOT}, commit {head}" in first
    assert shim.startswith("shim: vgpu-patch-shim 0.1.0")


def test_build_without_the_extra_names_the_command(tmp_path: Path) -> None:
    """The one-line error keeps the words .ci/run looks for, and the command runs pip from this checkout."""
    from vgpu_patch.report.errors import BuildError
    from vgpu_patch.shim_build.toolchain import resolve

    with pytest.raises(BuildError) as e:
        resolve(str(tmp_path / "no-cc"), None, None)
    msg = str(e.value)
    assert "vgpu-patch[build] extra" in msg and f"-m pip install -e '{ROOT}[build]'" in msg and "\n" not in msg
