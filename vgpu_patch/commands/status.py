"""`vgpu-patch status` (placeholder: not implemented yet)."""
import click

from ..errors import VgpuPatchError


@click.command("status")
def cli() -> None:
    """Not implemented yet."""
    raise VgpuPatchError("'vgpu-patch status' is not implemented in this version")
