"""Where this copy of vgpu-patch came from, and the install command that works from there.

No package index carries vgpu-patch: it is installed from a checkout (`pip install -e .`), a wheel file
or a git URL. A hint naming only the project and its extra would send pip to PyPI and fail, so every
"install the extra" hint is built here, from pip's own record of the install (PEP 610 direct_url.json):
a checkout gets `pip install -e 'DIR[build]'`, a wheel `pip install 'FILE.whl[build]'`, a git URL
`pip install 'vgpu-patch[build] @ git+URL@COMMIT'`, and anything else the extra's own packages (which
are on PyPI). The same record gives `--version` its commit.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

DIST = "vgpu-patch"
# the packages each extra adds (pyproject.toml's [project.optional-dependencies]; a test holds them equal)
EXTRAS: dict[str, tuple[str, ...]] = {
    "build": ("ziglang>=0.13", "nvidia-cuda-runtime>=12.0", "nvidia-nvml-dev>=12.0"),
    "inventory": ("ansible-core>=2.15",),
}


@dataclass(frozen=True)
class Origin:
    kind: str  # "checkout" (editable or a local directory), "wheel", "git", "unknown"
    where: str  # the directory, the wheel file or the URL ("" when unknown)
    commit: str | None = None  # the git commit, when known
    editable: bool = False


def _direct_url() -> dict | None:
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        text = distribution(DIST).read_text("direct_url.json")
    except (PackageNotFoundError, OSError, ValueError):
        return None
    try:
        doc = json.loads(text) if text else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _checkout_of_this_module() -> Path | None:
    """The source tree this module is running from, when it is one (a pyproject.toml beside the package)."""
    root = Path(__file__).resolve().parents[2]  # vgpu_patch/release/install.py: the tree holding vgpu_patch/
    return root if (root / "pyproject.toml").is_file() and (root / "vgpu_patch").is_dir() else None


def _git_commit(root: Path) -> str | None:
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def origin() -> Origin:
    """Where the running copy came from: a checkout on sys.path wins over what pip recorded."""
    checkout = _checkout_of_this_module()
    doc = None if checkout else _direct_url()
    if checkout is not None:  # running from the source tree itself: an editable install of it fits
        return Origin("checkout", str(checkout), _git_commit(checkout), editable=True)
    if doc:
        url = str(doc.get("url", ""))
        vcs = doc.get("vcs_info")
        if isinstance(vcs, dict):
            return Origin("git", url, str(vcs.get("commit_id") or "")[:12] or None)
        path = unquote(urlparse(url).path) if url.startswith("file:") else ""
        if path.endswith(".whl"):
            return Origin("wheel", path)
        if path:
            editable = bool(doc.get("dir_info", {}).get("editable"))
            return Origin("checkout", path, _git_commit(Path(path)), editable=editable)
    return Origin("unknown", "")


def pip() -> str:
    """pip of the Python running vgpu-patch (a venv's pip, not whichever is first on PATH)."""
    exe = sys.executable or "python3"
    return f"{shlex.quote(exe) if os.path.basename(exe) != exe else exe} -m pip"


def install_command(extra: str, where: Origin | None = None) -> str:
    """A command that installs `extra` into this Python from where this copy came from."""
    o = where or origin()
    if o.kind == "checkout":
        flag = "-e " if o.editable else ""
        return f"{pip()} install {flag}{shlex.quote(f'{o.where}[{extra}]')}"
    if o.kind == "wheel" and Path(o.where).is_file():
        return f"{pip()} install {shlex.quote(f'{o.where}[{extra}]')}"
    if o.kind == "git":
        ref = f"git+{o.where}" + (f"@{o.commit}" if o.commit else "")
        return f"{pip()} install {shlex.quote(f'{DIST}[{extra}] @ {ref}')}"
    return f"{pip()} install " + " ".join(shlex.quote(p) for p in EXTRAS[extra])


def extra_hint(extra: str) -> str:
    """`the vgpu-patch[build] extra (…): run `CMD``: the one phrase every missing-extra error ends with."""
    what = ", ".join(p.split(">")[0] for p in EXTRAS[extra])
    return f"install the {DIST}[{extra}] extra ({what}): `{install_command(extra)}`"


def version_text() -> str:
    """`vgpu-patch --version`: the tool, where it came from (with the commit when known), the shim it builds."""
    from .. import __version__
    from ..shim.region import MAJOR, MINOR

    o = origin()
    source = {"checkout": f"checkout {o.where}", "wheel": f"wheel {o.where}", "git": f"git {o.where}",
              "unknown": "installed package"}[o.kind]
    commit = f", commit {o.commit}" if o.commit else ""
    py = ".".join(map(str, sys.version_info[:3]))
    return (f"vgpu-patch {__version__} ({source}{commit}; Python {py})\n"
            f"shim: vgpu-patch-shim {__version__} (what `vgpu-patch build` makes; HAMi shared region layout "
            f"{MAJOR}.{MINOR})")
