"""Pick the C compiler for a target (arch + glibc floor): `zig cc` or a gcc-compatible driver.

zig cc links against glibc stubs of the exact floor, so a build on a glibc 2.36 host still only asks
for GLIBC_2.28 (or 2.17) symbols, and it cross-compiles to aarch64. Plain gcc links against the host's
glibc: fine when the host is at or below the floor, otherwise the ELF proof in build.py rejects it.
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..report.errors import BuildError, UsageError

# arch name -> (e_machine name, zig target cpu, aliases gcc's -dumpmachine may print)
ARCHES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "x86_64": ("EM_X86_64", "x86_64", ("x86_64", "amd64")),
    "aarch64": ("EM_AARCH64", "aarch64", ("aarch64", "arm64")),
}
FLOORS = ("2.17", "2.28")
DEFAULT_FLOOR = "2.28"


def build_extra() -> str:
    """The [build] extra (zig and the CUDA/NVML headers), with the pip command that works for this install."""
    from ..release.install import extra_hint

    return extra_hint("build")


def install_hint() -> str:
    return f"{build_extra()} (zig: any glibc floor, any arch), or `apt-get install gcc`"


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def normalize_arch(arch: str | None) -> str:
    """`None` -> the host's arch; `amd64`/`arm64` -> `x86_64`/`aarch64`; anything else is a UsageError."""
    raw = (arch or platform.machine()).lower()
    for name, (_, _, aliases) in ARCHES.items():
        if raw in aliases:
            return name
    raise UsageError(f"unknown arch {raw!r}: choose one of {', '.join(ARCHES)}")


def check_floor(glibc: str | None) -> str | None:
    if glibc is None or glibc in FLOORS:
        return glibc
    raise UsageError(f"unknown glibc floor {glibc!r}: choose one of {', '.join(FLOORS)}")


def host_arch() -> str:
    return normalize_arch(None)


def host_glibc() -> str | None:
    """The running glibc's version (`2.36`), or None on a non-glibc host."""
    try:
        s = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    parts = s.split()
    return parts[1] if len(parts) == 2 and parts[0] == "glibc" else None


def zig_cache_dir() -> Path:
    """zig's global cache (its per-target libc builds): reused across builds, never part of the output."""
    env = os.environ.get("VGPU_PATCH_ZIG_CACHE")
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "vgpu-patch" / "zig"


@dataclass
class Toolchain:
    kind: str  # "zig" | "gcc" (any gcc-compatible driver: gcc, cc, clang, a cross gcc)
    argv: list[str]  # the command prefix that compiles and links
    version: str  # first line of `--version` / `zig version`
    arch: str
    glibc: str | None  # the floor asked for (None: whatever the compiler's libc is)
    target_args: list[str] = field(default_factory=list)
    # (directory, stand-in) pairs for -ffile-prefix-map: install paths must not reach debug info
    path_maps: list[tuple[str, str]] = field(default_factory=list)
    triple: str = ""  # gcc's -dumpmachine (zig's target is in target_args)
    package: str = ""  # `ziglang 0.13.0` when zig came from the wheel, for the build manifest

    @property
    def target(self) -> str:
        if self.kind == "zig":
            return self.target_args[1]
        return self.triple or f"{self.arch}-linux-gnu"

    @property
    def name(self) -> str:
        return "zig cc" if self.kind == "zig" else Path(self.argv[0]).name

    def env(self, build_dir: Path) -> dict[str, str]:
        """Environment for every compiler call: an epoch, C locale, UTC, zig caches in known places.

        SOURCE_DATE_EPOCH is the caller's when set (else 0); the build's -Wdate-time keeps it out of
        the bytes anyway, so it is not a build input."""
        env = dict(os.environ)
        epoch = env.get("SOURCE_DATE_EPOCH") or "0"
        if not epoch.isdigit():
            raise UsageError(f"SOURCE_DATE_EPOCH={epoch!r} is not a count of seconds: unset it or give an integer")
        env.update({"SOURCE_DATE_EPOCH": epoch, "LC_ALL": "C", "TZ": "UTC"})
        if self.kind == "zig":
            env["ZIG_GLOBAL_CACHE_DIR"] = str(zig_cache_dir())
            env["ZIG_LOCAL_CACHE_DIR"] = str(build_dir / "zig-local")
        return env


def _run_version(argv: list[str]) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"compiler {argv[0]} cannot run ({e}): {install_hint()}") from None
    out = (p.stdout or p.stderr).strip().splitlines()
    if p.returncode != 0 or not out:
        raise BuildError(f"compiler {' '.join(argv)} failed (exit {p.returncode}): {install_hint()}")
    return out[0].strip()


def _zig_argv() -> list[str] | None:
    """`python -m ziglang` when the wheel is installed, else a `zig` on PATH."""
    if importlib.util.find_spec("ziglang") is not None:
        return [sys.executable, "-m", "ziglang"]
    z = shutil.which("zig")
    return [z] if z else None


def _zig(base: list[str], arch: str, glibc: str | None) -> Toolchain:
    floor = glibc or DEFAULT_FLOOR  # zig always needs a version; the default floor is the safe one
    version = _run_version(base + ["version"])
    target = f"{ARCHES[arch][1]}-linux-gnu.{floor}"
    maps = [(lib, "/zig-lib")] if (lib := _zig_lib_dir(base)) else []
    package = ""
    if base[1:] == ["-m", "ziglang"]:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):  # importable, not a distribution
            package = f"ziglang {importlib.metadata.version('ziglang')}"
    return Toolchain("zig", base + ["cc"], f"zig {version}", arch, floor, ["-target", target], maps, package=package)


def _zig_lib_dir(base: list[str]) -> str | None:
    """zig's bundled libc headers dir, from `zig env` (ZON in 0.15+, JSON before)."""
    try:
        p = subprocess.run(base + ["env"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r'"?\.?lib_dir"?\s*[=:]\s*"([^"]+)"', p.stdout)
    return m.group(1) if m else None


def _gcc_like(path: str, arch: str, glibc: str | None) -> Toolchain:
    version = _run_version([path, "--version"])
    machine = _run_version([path, "-dumpmachine"])
    target_arch = machine.split("-")[0].lower()
    if target_arch not in ARCHES[arch][2]:
        raise BuildError(
            f"compiler {path} targets {machine}, not {arch}: use `--compiler zig` ({build_extra()}) "
            f"or a {arch} cross compiler"
        )
    return Toolchain("gcc", [path], version, arch, glibc, triple=machine)


def resolve(compiler: str | None, arch: str | None, glibc: str | None) -> Toolchain:
    """The toolchain for `compiler` ('zig', 'gcc', a name or path, or None = choose) and the target."""
    arch = normalize_arch(arch)
    glibc = check_floor(glibc)
    if compiler in (None, "", "auto"):
        return _auto(arch, glibc)
    if compiler == "zig":
        base = _zig_argv()
        if base is None:
            raise BuildError(f"zig not found (tried `python -m ziglang` and `zig` on PATH): {build_extra()}")
        return _zig(base, arch, glibc)
    path = shutil.which(compiler)
    if path is None:
        raise BuildError(f"compiler {compiler!r} not found (not on PATH, not an executable file): {install_hint()}")
    if Path(path).name.startswith("zig"):
        return _zig([path], arch, glibc)
    return _gcc_like(path, arch, glibc)


KINDS = ("zig", "gcc")


def own_compiler(kind: str) -> str:
    """This install's compiler of `kind` ('zig' or 'gcc'), as `resolve` takes it: the ziglang wheel (else a zig on
    an absolute PATH entry) or gcc/cc found on an absolute PATH entry, as an absolute path. For `build --reproduce`:
    a manifest names the compiler that made a build, and that name is compared, never run."""
    if kind not in KINDS:
        raise UsageError(f"compiler kind {kind!r} is unknown to this version: it rebuilds with {' or '.join(KINDS)}")
    trusted = os.pathsep.join(p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if os.path.isabs(p))
    if kind == "zig":
        if importlib.util.find_spec("ziglang") is not None:
            return "zig"
        found = shutil.which("zig", path=trusted)
        if found is None:
            raise BuildError(f"zig not found (the ziglang wheel, or zig on PATH): {build_extra()}")
        return found
    found = shutil.which("gcc", path=trusted) or shutil.which("cc", path=trusted)
    if found is None:
        raise BuildError(f"gcc not found on PATH (nor cc): {install_hint()}")
    return found


def _auto(arch: str, glibc: str | None) -> Toolchain:
    """gcc when it can meet the target natively (same arch, host glibc <= floor), else zig."""
    hg = host_glibc()
    native_ok = arch == host_arch() and hg is not None and (glibc is None or version_tuple(hg) <= version_tuple(glibc))
    zig = _zig_argv()
    gcc = shutil.which("gcc") or shutil.which("cc")
    if native_ok and gcc:
        return _gcc_like(gcc, arch, glibc)
    if zig:
        return _zig(zig, arch, glibc)
    if gcc and not native_ok:
        raise BuildError(
            f"building for {arch} glibc {glibc} on a {host_arch()} glibc {hg} host needs zig, which is "
            f"not installed: {build_extra()}"
        )
    raise BuildError(f"no C compiler found (tried `python -m ziglang`, zig, gcc, cc on PATH): {install_hint()}")
