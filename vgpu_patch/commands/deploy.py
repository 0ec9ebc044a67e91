"""`vgpu-patch deploy` (placeholder: not implemented yet)."""
import click

from ..errors import VgpuPatchError


@click.command("deploy")
def cli() -> None:
    """Not implemented yet."""
    raise VgpuPatchError("'vgpu-patch deploy' is not implemented in this version")
