"""`vgpu-patch rollback` (placeholder: not implemented yet)."""
import click

from ..errors import VgpuPatchError


@click.command("rollback")
def cli() -> None:
    """Not implemented yet."""
    raise VgpuPatchError("'vgpu-patch rollback' is not implemented in this version")
