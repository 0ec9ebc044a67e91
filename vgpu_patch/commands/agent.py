"""`vgpu-patch agent` (placeholder: not implemented yet)."""
import click

from ..errors import VgpuPatchError


@click.command("agent")
def cli() -> None:
    """Not implemented yet."""
    raise VgpuPatchError("'vgpu-patch agent' is not implemented in this version")
