"""`vgpu-patch build` (placeholder: not implemented yet)."""
import click

from ..errors import VgpuPatchError


@click.command("build")
def cli() -> None:
    """Not implemented yet."""
    raise VgpuPatchError("'vgpu-patch build' is not implemented in this version")
