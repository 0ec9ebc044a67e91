"""`vgpu-patch region` (placeholder: not implemented yet)."""
import click

from ..errors import VgpuPatchError


@click.command("region")
def cli() -> None:
    """Not implemented yet."""
    raise VgpuPatchError("'vgpu-patch region' is not implemented in this version")
