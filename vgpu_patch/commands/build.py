"""`vgpu-patch build`: compile c_src into a reproducible libvgpu.so + manifest, then check it."""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import click

from ..report.errors import EXIT_FAILED, EXIT_INCOMPATIBLE
from ..shim_build.build import PROFILES, build_shim
from ..shim_build.toolchain import ARCHES, DEFAULT_FLOOR, FLOORS
from .options import emit_json, existing_path, json_option, verbose_option

EPILOG = """\b
Examples:
  vgpu-patch build -o out/
  vgpu-patch build --arch aarch64 --glibc 2.17 -o out/arm64
  vgpu-patch build --compiler zig --profile debug --no-check
  vgpu-patch build --json > build.json
  vgpu-patch build -o out/ --sign ~/.ssh/release_ed25519      # also writes out/libvgpu.so.sig
  vgpu-patch build --reproduce out/libvgpu.so.json              # rebuild and compare the bytes
\b
The default compiler is gcc when it can meet the target natively (same arch, host glibc <= floor),
else `zig cc` from the ziglang wheel. The result is proven from the ELF: a required GLIBC_x.y above
the floor, GLIBC_PRIVATE, a wrong arch or exports that differ from hooks.def fail the build.
The same inputs give the same bytes, whatever the build, cache or install directory; the manifest records
them, and --reproduce rebuilds from it (target, compiler kind and profile taken from the manifest; the
compiler is this install's, never one the manifest names).
Exit codes: 0 built (and check passed), or --reproduce matched; 1 build failed, or --reproduce gave other
bytes (one line names the inputs that differ); 2 usage error; 4 the drop-in check failed.
"""


def _glibc(v: str | None) -> str:
    return f"GLIBC_{v}" if v else "no GLIBC symbols"


def _run_check(library: Path, glibc: str, arch: str) -> tuple[Any | None, str | None]:
    """The drop-in check (vgpu_patch.elf.check), or (None, why it was skipped)."""
    try:
        elfcheck = importlib.import_module("vgpu_patch.elf.check")
    except ModuleNotFoundError as e:
        if e.name != "vgpu_patch.elf.check":
            raise  # the checker exists but is broken: say so, do not skip silently
        return None, "drop-in check skipped: vgpu_patch.elf.check is not available in this version"
    return elfcheck.check_file(library, vendor=None, glibc=glibc, arch=arch), None


@click.command("build", epilog=EPILOG)
@verbose_option
@click.option(
    "-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("out"),
    show_default=True, help="Directory for libvgpu.so and libvgpu.so.json.",
)
@click.option("--arch", type=click.Choice(list(ARCHES)), default=None, help="Target arch [default: this host's].")
@click.option("--glibc", type=click.Choice(list(FLOORS)), default=DEFAULT_FLOOR, show_default=True,
              help="Oldest glibc the library must load on (containers' glibc, not the node's).")
@click.option("--compiler", default=None, metavar="zig|gcc|PATH",
              help="Compiler to use [default: gcc if it meets the target natively, else zig].")
@click.option("--profile", type=click.Choice(list(PROFILES)), default="release", show_default=True,
              help="; ".join(f"{p.name}: {p.help}" for p in PROFILES.values()))
@click.option("--src", "src_dir", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="Shim source tree [default: the package's c_src].")
@click.option("--no-check", is_flag=True, help="Skip the drop-in check after building.")
@click.option("--sign", "sign_key", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="KEY",
              help="Sign the library with this OpenSSH key (ssh-keygen -Y sign, namespace vgpu-patch; a public "
                   "key works when ssh-agent holds its private half) into libvgpu.so.sig; also write the build's "
                   "provenance (in-toto statement, SLSA v1) as libvgpu.so.intoto.json, signed the same way.")
@click.option("--reproduce", "reproduce_manifest", type=click.Path(dir_okay=False, path_type=Path),
              default=None, metavar="MANIFEST",
              help="Rebuild what this build manifest (libvgpu.so.json, or the provenance libvgpu.so.intoto.json "
                   "that carries it) describes, in a temporary directory, and "
                   "compare its sha256 with the recorded one; writes nothing. It uses this install's compiler of "
                   "the manifest's kind (the compiler the manifest names is compared, never run) and names every "
                   "define a release build does not have.")
@click.option("--allow-defines", is_flag=True,
              help="With --reproduce: rebuild even when the manifest has -D defines this version's shim build does "
                   "not know (refused otherwise); the verdict names them.")
@json_option
def cli(out_dir: Path, arch: str | None, glibc: str, compiler: str | None, profile: str, src_dir: Path | None,
        no_check: bool, sign_key: Path | None, reproduce_manifest: Path | None, allow_defines: bool,
        as_json: bool) -> None:
    """Build libvgpu.so from c_src for a glibc floor and arch, reproducibly, with a JSON manifest.

    Example: vgpu-patch build -o out/ --glibc 2.28
    """
    existing_path("signing key", sign_key)
    existing_path("manifest", reproduce_manifest)
    if reproduce_manifest is not None:
        _reproduce(reproduce_manifest, src_dir, as_json, allow_defines)
        return
    if allow_defines:
        raise click.UsageError("--allow-defines goes with --reproduce MANIFEST: a build takes no defines")
    click.echo(f"building libvgpu.so ({profile}, glibc {glibc}, {arch or 'host arch'}) into {out_dir}/ ...", err=True)
    result = build_shim(out_dir, arch=arch, glibc=glibc, compiler=compiler, profile=profile,
                         src_dir=src_dir)
    m = result.manifest
    doc: dict[str, Any] = {"library": str(result.library), "manifest_path": str(result.manifest_path), "build": m}
    if sign_key is not None:
        from ..release import provenance
        from ..release.install import origin
        from ..release.signing import sign

        doc["signature"] = str(sign(result.library, sign_key))
        # the build's provenance beside it (in-toto, SLSA v1), signed with the same key; the commit is this
        # install's, so only for the package's own c_src
        statement = provenance.write(result.library, m, origin().commit if src_dir is None else None)
        doc["provenance"] = str(statement)
        doc["provenance_signature"] = str(sign(statement, sign_key))

    report, skipped = (None, "drop-in check skipped (--no-check)") if no_check else _run_check(
        result.library, m["glibc_floor"], m["arch"])
    doc["check"] = report.to_json() if report is not None else {"skipped": skipped}

    if as_json:
        emit_json(doc)
    else:
        click.echo(f"library      {result.library}")
        click.echo(f"sha256       {m['sha256']}")
        click.echo(f"size         {m['size']} bytes")
        click.echo(f"arch         {m['arch']} ({m['target']})")
        click.echo(f"glibc floor  {m['glibc_floor']} (max required: {_glibc(m['glibc_max_required'])})")
        click.echo(f"compiler     {m['compiler']['version']}")
        click.echo(f"manifest     {result.manifest_path}")
        if "signature" in doc:
            click.echo(f"signature    {doc['signature']}")
            click.echo(f"provenance   {doc['provenance']} (signed: {doc['provenance_signature']})")
        if report is not None:
            click.echo(importlib.import_module("vgpu_patch.elf.check").render_table(report))
    if skipped:
        click.echo(skipped, err=True)
    if report is not None and not report.ok:
        if not as_json:
            click.secho("drop-in check FAILED", fg="red", err=True)
        click.get_current_context().exit(report.exit_code or EXIT_INCOMPATIBLE)


def _reproduce(manifest: Path, src_dir: Path | None, as_json: bool, allow_defines: bool) -> None:
    """--reproduce: the manifest decides the target, compiler and profile, so those options are refused."""
    ctx = click.get_current_context()
    given = [max(p.opts, key=len) for p in ctx.command.params
             if p.name not in ("reproduce_manifest", "src_dir", "as_json", "allow_defines") and p.name
             and ctx.get_parameter_source(p.name) not in (None, click.core.ParameterSource.DEFAULT)]
    if given:
        raise click.UsageError(f"--reproduce takes the build's settings from {manifest}: drop {', '.join(given)}")
    from ..shim_build.reproduce import reproduce

    click.echo(f"rebuilding what {manifest} describes ...", err=True)
    r = reproduce(manifest, src_dir, allow_defines=allow_defines)
    if as_json:
        emit_json(r.to_json())
    else:
        click.echo(r.line(), err=not r.ok)
    if not r.ok:
        ctx.exit(EXIT_FAILED)
