"""Build `libvgpu.so` from c_src: reproducible, for a glibc floor and an arch, with a JSON manifest.

Steps: pick the toolchain (toolchain.py) and headers (headers.py) -> compile every c_src/**/*.c and
*.S except c_src/tests/ (sorted, in parallel, from inside the source dir so paths are relative) ->
link with a version script generated from hooks.def -> prove the ELF (elf/proof.py: arch, GLIBC
floor, exports) -> move the .so into out_dir atomically and write `libvgpu.so.json` next to it.

Reproducibility: sorted inputs, `-ffile-prefix-map` for every absolute directory, `-Wdate-time`, no
debug info in a release (the toolchain's own libc pieces stripped too), the link run from `/`, a sha1
build-id over the content, and a throwaway build dir: the same inputs (the manifest records them) give
the same sha256 whatever the build, cache or install directory. reproduce.py rebuilds from a manifest.
"""
from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..elf import proof
from ..release.digest import sha256_file
from ..release.provenance import statement_path
from ..release.signing import signature_path
from ..report import verbosity
from ..report.errors import BuildError, UsageError
from . import headers, manifest, toolchain
from .sources import HOOKS_DEF_PLACES, c_src_dir, find_hooks_def
from .surface import exported_names

SRC_DIR = c_src_dir()  # the packaged shim sources (sources.py)
LIBRARY = "libvgpu.so"
SONAME = "libvgpu.so"
# -Wdate-time (an error under -Werror): __DATE__/__TIME__/__TIMESTAMP__ would make the bytes depend on the clock
BASE_CFLAGS = ["-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror", "-Wdate-time", "-std=gnu11"]
LINK_LIBS = ["-ldl", "-lpthread"]
LDFLAGS = ["-Wl,-z,noexecstack", "-Wl,-z,relro,-z,now", "-Wl,--build-id=sha1", f"-Wl,-soname,{SONAME}"]
# zig cc turns on UBSan (with a runtime) for unoptimised builds; a preloaded shim must not carry it.
ZIG_CFLAGS = ["-fno-sanitize=all"]
# zig's link garbage-collects sections, dropping `used` data such as the `vgpu-patch-shim <v>` ident
# deploy tools look for; GNU ld keeps them, so ask zig for the same.
ZIG_LDFLAGS = ["-Wl,--no-gc-sections"]
COMPILE_TIMEOUT_S = 900  # zig builds its libc for a new target on first use (a minute or two)


@dataclass(frozen=True)
class Profile:
    """A named build variant: optimisation/debug flags plus -D switches the C honours."""

    name: str
    cflags: tuple[str, ...]
    defines: tuple[str, ...] = ()
    help: str = ""
    ldflags: tuple[str, ...] = ()


PROFILES: dict[str, Profile] = {
    # --strip-debug: -g0 covers our objects, not the libc pieces the toolchain links in (zig's glibc stat
    # stubs carry DWARF naming zig's install dir and the directory they were first compiled from)
    "release": Profile("release", ("-O2", "-g0"), (), "optimised, no debug info (default)",
                       ("-Wl,--strip-debug",)),
    # c_src/log/log.h compiles VGPU_DEBUG(...) logging in only under VGPU_DEBUG_BUILD
    "debug": Profile("debug", ("-O0", "-g"), ("VGPU_DEBUG_BUILD=1",),
                     "no optimisation, debug info, VGPU_DEBUG logging"),
}


@dataclass
class BuildResult:
    library: Path
    manifest: dict[str, Any]
    manifest_path: Path
    facts: proof.ElfFacts | None = field(default=None, repr=False)

    @property
    def sha256(self) -> str:
        return self.manifest["sha256"]


def header_dir() -> Path:
    """The CUDA/NVML include directory the shim builds against (see headers.py for the search order)."""
    return headers.header_dir()


def list_sources(src_dir: Path) -> list[Path]:
    """Relative paths of every .c/.S under src_dir except tests/, sorted."""
    return [p for p in manifest.source_files(src_dir) if p.suffix in (".c", ".S")]


def version_script(names: list[str]) -> str:
    """`{ global: <names>; local: *; };` so only the hooks.def names leave the library."""
    if not names:
        return "{\n  local: *;\n};\n"
    body = "".join(f"    {n};\n" for n in sorted(names))
    return "{\n  global:\n" + body + "  local: *;\n};\n"


def _first_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        if re.search(r"\b(error|fatal error|undefined reference)\b", ln, re.IGNORECASE):
            return ln
    return lines[0] if lines else "no output"


_SCRIPT_ENV = ("SOURCE_DATE_EPOCH", "LC_ALL", "TZ", "ZIG_GLOBAL_CACHE_DIR", "ZIG_LOCAL_CACHE_DIR")


def _run(argv: list[str], *, cwd: Path, env: dict[str, str], what: str, log_dir: Path) -> None:
    try:
        with verbosity.step("build", what, verbosity.describe(shlex.join(argv))):
            p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        rc, err = p.returncode, p.stderr + p.stdout
    except subprocess.TimeoutExpired:
        rc, err = -1, f"error: timed out after {COMPILE_TIMEOUT_S}s"
    except OSError as e:
        rc, err = -1, f"error: cannot run {argv[0]}: {e}"
    if rc == 0:
        return
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", what)
    cmd_file = log_dir / f"failed-{safe}.sh"
    exports = "".join(
        f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()) if k in _SCRIPT_ENV and v != os.environ.get(k)
    )
    cmd_file.write_text(f"#!/bin/sh\n# {what}: exit {rc}\n{exports}cd {shlex.quote(str(cwd))}\n{shlex.join(argv)}\n")
    (log_dir / f"failed-{safe}.log").write_text(err)
    raise BuildError(f"{what} failed: {_first_error(err)} (command: {cmd_file})")


def _snapshot(src_dir: Path, dest: Path) -> Path:
    """Copy every build-relevant file of src_dir (manifest.source_files) to dest."""
    for rel in manifest.source_files(src_dir):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src_dir / rel, dest / rel)
    return dest


def _normalize(flags: list[str], subs: dict[str, str]) -> list[str]:
    """Flags with absolute paths replaced by $SRC/$CUDA_INCLUDE/$BUILD, for the manifest."""
    out = []
    for f in flags:
        for path, token in sorted(subs.items(), key=lambda kv: -len(kv[0])):  # longest path first
            f = f.replace(path, token)
        out.append(f)
    return out


def _headers_sha256(dirs: list[Path]) -> str:
    h = hashlib.sha256()
    for name in headers.REQUIRED:
        for d in dirs:
            if (d / name).is_file():
                h.update(name.encode() + b"\0" + (d / name).read_bytes())
                break
    return h.hexdigest()


def _cuda_version(dirs: list[Path]) -> int | None:
    for d in dirs:
        f = d / "cuda.h"
        if f.is_file():
            m = re.search(rb"#define\s+CUDA_VERSION\s+(\d+)", f.read_bytes())
            return int(m.group(1)) if m else None
    return None


def build_shim(
    out_dir: Path,
    *,
    arch: str | None = None,
    glibc: str | None = toolchain.DEFAULT_FLOOR,
    compiler: str | None = None,
    profile: str = "release",
    src_dir: Path | None = None,
    header_dirs: list[Path] | None = None,
    extra_defines: list[str] | None = None,
) -> BuildResult:
    """Build src_dir (default: the repo's c_src) into out_dir/libvgpu.so + libvgpu.so.json.

    glibc=None means no floor (link against whatever libc the compiler has; still proven free of
    GLIBC_PRIVATE). compiler: None (gcc when it meets the target natively, else zig), 'zig', 'gcc',
    or a name/path. Raises BuildError / UsageError with a one-line message.
    """
    if profile not in PROFILES:
        raise UsageError(f"unknown build profile {profile!r}: choose one of {', '.join(PROFILES)}")
    prof = PROFILES[profile]
    src_dir = Path(src_dir or SRC_DIR).resolve()
    if not src_dir.is_dir():
        raise BuildError(f"shim sources {src_dir} not found: reinstall vgpu-patch or give --src DIR")
    hooks_def = find_hooks_def(src_dir)
    if not hooks_def.is_file():
        raise BuildError(f"{hooks_def} not found: the shim sources are incomplete "
                         f"(need {' or '.join(HOOKS_DEF_PLACES)})")
    if not list_sources(src_dir):
        raise BuildError(f"no .c or .S files under {src_dir} (tests/ excluded): nothing to build")
    tc = toolchain.resolve(compiler, arch, glibc)
    hdirs = [Path(d).resolve() for d in header_dirs] if header_dirs else headers.find_header_dirs()
    out_dir = Path(out_dir)

    build_dir = Path(tempfile.mkdtemp(prefix="vgpu-build-"))
    ok = False
    try:
        # compile a snapshot: the manifest's hashes then describe exactly what was compiled, even
        # while someone edits c_src, and the snapshot's path is mapped away like any other
        orig_src, src_dir = src_dir, _snapshot(src_dir, build_dir / "src")
        hooks_def = find_hooks_def(src_dir)
        names = exported_names(hooks_def)
        src_sha = manifest.source_hash(src_dir)
        hooks_sha = sha256_file(hooks_def)
        sources = list_sources(src_dir)
        subs = {str(build_dir): "$BUILD", str(src_dir): "$SRC", str(orig_src): "$SRC"}
        subs.update({str(d): "$CUDA_INCLUDE" if i == 0 else f"$CUDA_INCLUDE{i}" for i, d in enumerate(hdirs)})
        prefix_maps = [f"-ffile-prefix-map={src_dir}=."]
        prefix_maps += [f"-ffile-prefix-map={d}=/cuda-include{i or ''}" for i, d in enumerate(hdirs)]
        # no map for build_dir itself: it holds the snapshot and overlapping maps resolve differently
        # in gcc (last wins) and clang; only the snapshot's and objects' paths live there.
        prefix_maps += [f"-ffile-prefix-map={path}={token}" for path, token in tc.path_maps]
        subs.update({path: f"${token.strip('/').upper().replace('-', '_')}" for path, token in tc.path_maps})
        # c_src/vgpu.h: VGPU_VERSION (#ifndef-guarded) goes into the `vgpu-patch-shim <v>` ident string
        all_defines = [f'VGPU_VERSION="{__version__}"'] + list(prof.defines) + list(extra_defines or [])
        defines = [f"-D{d}" for d in all_defines]
        cflags = (
            list(tc.target_args)
            + BASE_CFLAGS
            + list(prof.cflags)
            + (ZIG_CFLAGS if tc.kind == "zig" else [])
            + defines
            + [f"-I{src_dir}"]
            + [f"-I{d}" for d in hdirs]
            + prefix_maps
        )
        env = tc.env(build_dir)
        objs = []
        jobs = []
        for rel in sources:
            obj = build_dir / "obj" / (rel.as_posix() + ".o")
            obj.parent.mkdir(parents=True, exist_ok=True)
            objs.append(obj)
            jobs.append((tc.argv + cflags + ["-c", rel.as_posix(), "-o", str(obj)], f"compiling {rel.as_posix()}"))
        workers = max(1, min(len(jobs), os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(_run, argv, cwd=src_dir, env=env, what=what, log_dir=build_dir)
                       for argv, what in jobs]
            for fut in futures:
                fut.result()  # re-raises the first failure in source order

        vscript = build_dir / "exports.map"
        vscript.write_text(version_script(names))
        lib_tmp = build_dir / LIBRARY
        ldflags = ["-shared"] + LINK_LIBS + [f"-Wl,--version-script={vscript}"] + LDFLAGS + list(prof.ldflags)
        ldflags += ZIG_LDFLAGS if tc.kind == "zig" else []
        link = tc.argv + list(tc.target_args) + list(prof.cflags) + (ZIG_CFLAGS if tc.kind == "zig" else [])
        link += ["-o", str(lib_tmp)] + [str(o) for o in objs] + ldflags
        # from "/": zig compiles its libc pieces during the link, and their DWARF keeps the directory it ran in
        _run(link, cwd=Path("/"), env=env, what=f"linking {LIBRARY}", log_dir=build_dir)

        machine = toolchain.ARCHES[tc.arch][0]
        facts = proof.prove(lib_tmp, machine=machine, glibc=tc.glibc, exports=names)
        digest = sha256_file(lib_tmp)
        doc: dict[str, Any] = {
            "schema": manifest.SCHEMA,
            "file": LIBRARY,
            "soname": facts.soname,
            "sha256": digest,
            "size": lib_tmp.stat().st_size,
            "build_id": facts.build_id,
            "arch": tc.arch,
            "target": tc.target,
            "glibc_floor": tc.glibc,
            "glibc_max_required": facts.max_glibc,
            "glibc_versions": facts.glibc_versions,
            "needed": facts.needed,
            "compiler": {"kind": tc.kind, "name": tc.name, "version": tc.version, "package": tc.package},
            "profile": prof.name,
            "defines": [d[2:] for d in defines],
            "flags": {"cflags": _normalize(cflags, subs), "ldflags": _normalize(ldflags, subs)},
            "sources": [p.as_posix() for p in sources],
            "source_sha256": src_sha,
            "hooks_def_sha256": hooks_sha,
            "exports": len(names),
            "headers": {"cuda_version": _cuda_version(hdirs), "sha256": _headers_sha256(hdirs),
                        "packages": headers.header_packages(hdirs)},
            "tool": f"vgpu-patch {__version__}",
        }
        out_dir.mkdir(parents=True, exist_ok=True)  # only now: a failed build leaves no empty dir
        final = out_dir / LIBRARY
        fd, staged_name = tempfile.mkstemp(prefix=f".{LIBRARY}.", suffix=".tmp", dir=out_dir)
        staged = Path(staged_name)
        try:
            with os.fdopen(fd, "wb") as dst, open(lib_tmp, "rb") as src:
                shutil.copyfileobj(src, dst)
            os.chmod(staged, 0o755)
            # a signature of the previous library must not sit beside the new one (deploy would refuse
            # it as not matching; --sign writes a fresh one)
            signature_path(final).unlink(missing_ok=True)
            statement_path(final).unlink(missing_ok=True)  # and its provenance (--sign writes a fresh one)
            signature_path(statement_path(final)).unlink(missing_ok=True)
            os.replace(staged, final)  # never a half-written libvgpu.so, even for a reader mid-build
        finally:
            staged.unlink(missing_ok=True)
        mpath = out_dir / f"{LIBRARY}.json"
        manifest.write(mpath, doc)
        ok = True
        return BuildResult(library=final, manifest=doc, manifest_path=mpath, facts=facts)
    finally:
        # keep the build dir only when it holds a failed command for the user to re-run
        if ok or not any(build_dir.glob("failed-*.sh")):
            shutil.rmtree(build_dir, ignore_errors=True)
