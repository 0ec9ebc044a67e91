"""`vgpu-patch check` (placeholder: not implemented yet)."""
import click

from ..errors import VgpuPatchError


@click.command("check")
def cli() -> None:
    """Not implemented yet."""
    raise VgpuPatchError("'vgpu-patch check' is not implemented in this version")
