"""`vgpu-patch plugin-image`: derive HAMi's device-plugin image carrying our library (no more copy-back)."""
from __future__ import annotations

from pathlib import Path

import click

from .options import dry_run_option, emit_json, existing_path, json_option, verbose_option

EPILOG = """\b
Examples:
  vgpu-patch plugin-image --from projecthami/hami:v2.6.0 --library out/libvgpu.so --dry-run
  vgpu-patch plugin-image --from projecthami/hami:v2.6.0 --library out/libvgpu.so \\
      --tag registry.example.com/hami:v2.6.0-vgpu-patch
  # then point HAMi's chart at it: --set devicePlugin.image.repository=...,devicePlugin.image.tag=...
\b
Exit codes: 0 built (or --dry-run printed); 1 refused library, no builder, or the build failed;
2 usage error.
"""


@click.command("plugin-image", epilog=EPILOG)
@verbose_option
@click.option("--from", "base", required=True, metavar="IMAGE", help="Your HAMi device-plugin image reference.")
@click.option("--library", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The built libvgpu.so (its build manifest LIBRARY.json must be beside it).")
@click.option("--tag", default=None, help="The new image's reference [default: IMAGE's tag + -vgpu-patch-<version>].")
@click.option("--version", "version", default=None, metavar="VERSION",
              help="The plugin's VERSION (its libvgpu.so.<VERSION>) [default: read from IMAGE].")
@click.option("--builder", type=click.Choice(["auto", "buildah", "docker", "podman"]), default="auto",
              show_default=True, help="The image builder; auto takes the first found.")
@dry_run_option
@json_option
def cli(base: str, library: Path, tag: str | None, version: str | None, builder: str, dry_run: bool,
        as_json: bool) -> None:
    """Build an image FROM your device-plugin image that carries LIBRARY as
    /k8s-vgpu/lib/nvidia/libvgpu.so.<VERSION>, the file HAMi's plugin installs into /usr/local/vgpu and
    mounts into every container. The plugin then delivers our library itself: its copy-back on restart
    puts ours back, for good. --dry-run prints the Containerfile and the build command.
    """
    from ..agent.image import default_manifest, verify_image
    from ..k8s.plugin_image import CONTAINERFILE, Plan, build, default_tag, pick_builder, read_version

    existing_path("library", library)
    lib = verify_image(library)  # our build, exactly what its manifest names
    ours = lib.version or "foreign"
    plan = Plan(base, tag or default_tag(base, ours), version, pick_builder(builder, for_display=dry_run),
                lib.sha256, ours)
    if dry_run:
        argv = plan.build_argv("CONTEXT")
        if as_json:
            emit_json({"containerfile": CONTAINERFILE, "build": argv, "tag": plan.tag, "version": version,
                       "sha256": lib.sha256})
        else:
            click.echo(CONTAINERFILE, nl=False)
            click.echo("# CONTEXT holds: Containerfile, libvgpu.so (" + lib.sha256[:12] + "), vgpu-patch-manifest.json")
            click.echo("# " + " ".join(argv))
        return
    if plan.version is None:
        plan = Plan(plan.base, plan.tag, read_version(plan.builder, base), plan.builder, plan.sha256, plan.ours)
    build(plan, lib.path, default_manifest(lib.path))
    if as_json:
        emit_json({"tag": plan.tag, "version": plan.version, "sha256": lib.sha256, "builder": plan.builder})
    else:
        click.echo(f"built {plan.tag}: {base} with libvgpu.so.{plan.version} = vgpu-patch {ours} "
                   f"({lib.sha256[:12]}); set devicePlugin.image to it in HAMi's chart")
