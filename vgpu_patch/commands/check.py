"""`vgpu-patch check`: prove that a built shim is a safe drop-in for the vendor's libvgpu.so."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from ..report.errors import UsageError, VgpuPatchError
from .options import emit_json, error_document, json_option, use_color, verbose_option

EPILOG = """\b
Examples:
  vgpu-patch check out/libvgpu.so
  vgpu-patch check out/libvgpu.so --vendor /usr/local/vgpu/libvgpu.so.v2.6.0 --strict
  vgpu-patch check out/libvgpu.so --glibc-from-image ./ubi8-rootfs --json
  vgpu-patch check out/libvgpu-aarch64.so --arch aarch64 --glibc 2.17

\b
Exit status (a bitmask, like abidiff's):
  0  every rule passed (warnings allowed unless --strict)
  1  a file cannot be checked: empty/truncated/non-ELF/32-bit/not x86_64 or aarch64
  2  usage error (also a file that does not exist)
  4  incompatible: some rule failed (an aarch64 build against an x86_64 vendor: elf-machine)
  8  --strict only: some rule warned (12 = 4|8)
"""


@click.command("check", epilog=EPILOG)
@verbose_option
@click.argument("candidate", type=click.Path(path_type=Path))
@click.option("--vendor", type=click.Path(path_type=Path), metavar="FILE",
              help="The vendor's libvgpu.so to compare with (default: the built-in reference surface).")
@click.option("--glibc", "glibc", default="2.28", show_default=True, metavar="VERSION",
              help="Oldest glibc the library must load with; 'none' for no floor.")
@click.option("--glibc-from", "glibc_from", type=click.Path(path_type=Path), metavar="LIBC_OR_ROOTFS",
              help="Read the floor from a target's libc.so.6 (fetched from a node) or an unpacked image root.")
@click.option("--glibc-from-image", "glibc_from_image", type=click.Path(path_type=Path), metavar="ROOTFS_OR_LIBC",
              help="Same as --glibc-from, for a container image unpacked on disk.")
@click.option("--arch", type=click.Choice(["x86_64", "aarch64"]), help="Expected machine (default: the vendor's, "
              "else either).")
@click.option("--strict", is_flag=True, help="Warnings count too: exit bit 8 when any rule warns.")
@json_option
@click.pass_context
def cli(ctx: click.Context, candidate: Path, vendor: Path | None, glibc: str, glibc_from: Path | None,
        glibc_from_image: Path | None, arch: str | None, strict: bool, as_json: bool) -> None:
    """Check, rule by rule, that CANDIDATE is safe to preload in place of the vendor's libvgpu.so.

    Reads the ELF (bounded by the file's size): class, machine, OSABI, type, SONAME, NEEDED, RPATH/RUNPATH,
    interpreter, executable stack, TEXTREL, build-id; the exported CUDA/NVML/dlsym surface (nothing
    missing, hidden or extra, no data objects); symbol versions; the GLIBC_x.y floor and GLIBC_PRIVATE;
    the x86 ISA level. Prints one line per rule (pass/warn/fail/info), or one JSON document with --json.
    """
    from ..elf.check import check_file, glibc_floor_of_libc, render_table  # keeps `--help` fast
    from .options import existing_path

    try:
        for role, path in (("candidate", candidate), ("vendor", vendor), ("--glibc-from", glibc_from),
                           ("--glibc-from-image", glibc_from_image)):
            existing_path(role, path)
        source = None
        libc = glibc_from or glibc_from_image
        if glibc_from and glibc_from_image:
            raise UsageError("give only one of --glibc-from and --glibc-from-image")
        if libc is not None:
            if ctx.get_parameter_source("glibc") == click.core.ParameterSource.COMMANDLINE:
                raise UsageError("give either --glibc or --glibc-from/--glibc-from-image, not both")
            glibc = glibc_floor_of_libc(libc, arch)
            source = str(libc)
            click.echo(f"glibc floor {glibc} read from {libc}", err=True)
        report = check_file(candidate, vendor=vendor, glibc=glibc, arch=arch, strict=strict, glibc_source=source)
    except VgpuPatchError as e:
        click.echo(f"vgpu-patch: error: {e}", err=True)
        if as_json:
            emit_json({**error_document(str(e), e.exit_code, "check"), "candidate": str(candidate)})
        _exit(e.exit_code)
    if as_json:
        emit_json(report.to_json())
    else:
        click.echo(render_table(report, color=use_color()))
    _exit(report.exit_code)


def _exit(code: int) -> None:
    # SystemExit, not ctx.exit: `vgpu_patch.cli.main` runs click with standalone_mode=False, where
    # click turns ctx.exit(code) into a return value that main() drops.
    if code:
        sys.exit(code)

