"""Build real .so fixtures with gcc: a good shim-shaped baseline and variants that each differ in one property.

The surface (449 trivial functions) is compiled once without `cuMemAlloc_v2`, which lives in its own
small object so "missing" and "hidden" variants only need a different probe object, not a recompile.
Also used by bench/check_vs_abidiff.py.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from vgpu_patch.elf.reference import reference_surface

PROBE = "cuMemAlloc_v2"  # the surface name the missing/hidden variants take away

SOURCES = {
    "probe.c": f"int {PROBE}(void) {{ return 0; }}\n",
    "probe_hidden.c": f'__attribute__((visibility("hidden"))) int {PROBE}(void) {{ return 0; }}\n',
    "probe_weak.c": f"__attribute__((weak)) int {PROBE}(void) {{ return 0; }}\n",
    "probe_protected.c": f'__attribute__((visibility("protected"))) int {PROBE}(void) {{ return 0; }}\n',
    "probe_object.c": f"int {PROBE} = 1;\n",
    "probe_symver.c": (
        f"int vgpu_probe_impl(void) {{ return 0; }}\n"
        f'__asm__(".symver vgpu_probe_impl,{PROBE}@VGPU_1.0");\n'
    ),
    "relr.c": "static int slots[2];\nint *vgpu_slot_ptrs[2] = { &slots[0], &slots[1] };\n",
    "round_up.c": "unsigned long round_up(unsigned long x, unsigned long a) { return (x + a - 1) / a * a; }\n",
    "data.c": "int mutex = 1;\n",
    "thread.c": (
        "#include <pthread.h>\n"
        "static void *run(void *a) { return a; }\n"
        "int vgpu_spawn(void) { pthread_t t; return pthread_create(&t, 0, run, 0); }\n"
    ),
    "private.c": "extern char **_dl_argv;\nchar *vgpu_argv0(void) { return _dl_argv[0]; }\n",
    "textrel.c": "int counter;\nint *vgpu_counter(void) { return &counter; }\n",
    "interp.c": 'const char vgpu_interp[] __attribute__((section(".interp"))) = "/lib64/ld-linux-x86-64.so.2";\n',
    "isa.c": (
        "double vgpu_dot(const double *a, const double *b, int n)\n"
        "{ double s = 0; for (int i = 0; i < n; i++) s += a[i] * b[i]; return s; }\n"
    ),
    "extra.c": "int extra_helper(void) { return 1; }\n",
}
# Per-object compiler flags beyond -O2 -c; the default is -fPIC.
CFLAGS = {
    "textrel.c": ["-fno-PIC", "-mcmodel=large"],  # absolute 64-bit relocation in .text
    "isa.c": ["-fPIC", "-march=x86-64-v3"],
}


@dataclass
class Variant:
    objects: list[str] = field(default_factory=lambda: ["probe.o"])
    ldflags: list[str] = field(default_factory=list)
    exports: list[str] = field(default_factory=list)  # extra names made global by the version script
    soname: str = "libvgpu.so"
    build_id: bool = True
    version_node: str | None = None


# variant -> (how it is built, the one rule that must catch it)
VARIANTS: dict[str, tuple[Variant, str | None]] = {
    "good": (Variant(), None),
    "execstack": (Variant(ldflags=["-Wl,-z,execstack"]), "exec-stack"),
    "textrel": (Variant(objects=["probe.o", "textrel.o"], ldflags=["-Wl,-z,notext"]), "textrel"),
    "no-build-id": (Variant(build_id=False), "build-id"),
    "rpath": (Variant(ldflags=["-Wl,-rpath,/opt/vendor/lib"]), "rpath"),
    "needed": (Variant(ldflags=["-L{dir}", "-Wl,--no-as-needed", "-lextra"]), "needed"),
    "missing": (Variant(objects=[]), "surface-missing"),
    "hidden": (Variant(objects=["probe_hidden.o"]), "surface-visibility"),
    "extra-export": (Variant(objects=["probe.o", "round_up.o"], exports=["round_up"]), "extra-exports"),
    "data-export": (Variant(objects=["probe.o", "data.o"], exports=["mutex"]), "data-exports"),
    "glibc-2.34": (Variant(objects=["probe.o", "thread.o"], ldflags=["-pthread"]), "glibc-floor"),
    "glibc-private": (Variant(objects=["probe.o", "private.o"], ldflags=["/lib64/ld-linux-x86-64.so.2"]),
                      "glibc-private"),
    "wrong-soname": (Variant(soname="libcuda.so.1"), "soname"),
    "x86-64-v3": (Variant(objects=["probe.o", "isa.o"], ldflags=["-Wl,-z,x86-64-v3"]), "isa-level"),
    "interp": (Variant(objects=["probe.o", "interp.o"]), "interp"),
    "relr": (Variant(objects=["probe.o", "relr.o"], ldflags=["-Wl,-z,pack-relative-relocs"]), "glibc-floor"),
    "weak": (Variant(objects=["probe_weak.o"]), "surface-kind"),
    "protected": (Variant(objects=["probe_protected.o"]), "surface-visibility"),
    "surface-object": (Variant(objects=["probe_object.o"]), "surface-kind"),
    "hidden-version": (Variant(objects=["probe_symver.o"], version_node="VGPU_1.0"), "symbol-versions"),
}
# Not single-property fixtures, used by specific tests.
EXTRA_VARIANTS: dict[str, Variant] = {
    # a vendor-style build: surface plus leaked helpers and data, as HAMi's default visibility gives
    "vendor": Variant(objects=["probe.o", "round_up.o", "data.o"], exports=["round_up", "mutex"]),
    "versioned": Variant(version_node="VGPU_1.0"),
    "execstack-no-build-id": Variant(ldflags=["-Wl,-z,execstack"], build_id=False),
}


def surface_names() -> list[str]:
    return sorted(reference_surface().surface)


def _run(cmd: list[str], cwd: Path) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr}")


def write_sources(d: Path) -> None:
    names = [n for n in surface_names() if n != PROBE]
    (d / "surface.c").write_text("".join(f"int {n}(void) {{ return 0; }}\n" for n in names))
    for name, text in SOURCES.items():
        (d / name).write_text(text)


def version_script(d: Path, name: str, extra: list[str], node: str | None) -> Path:
    names = surface_names() + extra
    body = "  global:\n" + "".join(f"    {n};\n" for n in names) + "  local: *;\n"
    path = d / f"{name}.map"
    path.write_text(f"{node or ''} {{\n{body}}};\n")
    return path


def build_objects(d: Path) -> None:
    """Compile every source once; the surface object is the only slow one (~0.5 s)."""
    write_sources(d)
    procs = []
    for src in ["surface.c", *SOURCES]:
        flags = CFLAGS.get(src, ["-fPIC"])
        procs.append(subprocess.Popen(["gcc", "-O2", *flags, "-c", src, "-o", src[:-2] + ".o"], cwd=d,
                                      stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate()
        if p.returncode:
            raise RuntimeError(f"gcc failed in {d}:\n{err}")
    _run(["gcc", "-shared", "-fPIC", "-o", "libextra.so", "extra.o"], d)


def link(d: Path, name: str, v: Variant) -> Path:
    out = d / f"{name}.so"
    cmd = ["gcc", "-shared", "-o", out.name, "surface.o", *v.objects,
           f"-Wl,--version-script={version_script(d, name, v.exports, v.version_node).name}",
           f"-Wl,-soname,{v.soname}", "-Wl,--build-id=sha1" if v.build_id else "-Wl,--build-id=none",
           *[f.format(dir=d) for f in v.ldflags]]
    if "-Wl,-z,execstack" not in v.ldflags:
        cmd.append("-Wl,-z,noexecstack")
    _run(cmd, d)
    return out


def build_all(d: Path) -> dict[str, Path]:
    """Every variant of VARIANTS and EXTRA_VARIANTS, built in `d`; name -> path."""
    d.mkdir(parents=True, exist_ok=True)
    build_objects(d)
    variants = {n: v for n, (v, _) in VARIANTS.items()}
    variants.update(EXTRA_VARIANTS)
    return {name: link(d, name, v) for name, v in variants.items()}


def zig_available() -> bool:
    try:
        import ziglang  # noqa: F401
    except ImportError:
        return False
    return True


def zig_build(d: Path, name: str, target: str, source: str = "surface_all.c", soname: str = "libvgpu.so") -> Path:
    """Cross-build with zig cc; -nostdlib keeps it fast (no libc stubs to build on a cold cache)."""
    if source == "surface_all.c" and not (d / source).exists():
        (d / source).write_text("".join(f"int {n}(void) {{ return 0; }}\n" for n in surface_names()))
    out = d / f"{name}.so"
    _run([sys.executable, "-m", "ziglang", "cc", "-target", target, "-shared", "-fPIC", "-nostdlib", "-O1",
          f"-Wl,-soname,{soname}", "-Wl,--build-id=sha1", "-o", out.name, source], d)
    return out


def have_gcc() -> bool:
    return shutil.which("gcc") is not None


def cli_runner():
    """A CliRunner keeping stdout and stderr apart on click 8.1 (mix_stderr) and 8.2+ (always apart)."""
    from click.testing import CliRunner

    try:
        return CliRunner(mix_stderr=False)
    except TypeError:
        return CliRunner()
