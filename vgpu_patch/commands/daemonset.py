"""`vgpu-patch daemonset` (placeholder: not implemented yet)."""
import click

from ..errors import VgpuPatchError


@click.command("daemonset")
def cli() -> None:
    """Not implemented yet."""
    raise VgpuPatchError("'vgpu-patch daemonset' is not implemented in this version")
