"""`vgpu-patch region show FILE`: decode a HAMi shared-region file as the node monitor does."""
from __future__ import annotations

import datetime

import click

from ..report import verbosity
from ..shim.region import Region, read_region
from .options import emit_json, json_option, verbose_option


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _render(r: Region) -> None:
    """Plain table via rich: colours only when stdout is a terminal (rich decides)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    n = min(r.device_num, 16)
    console.print(
        f"{r.path}: layout {r.major_version}.{r.minor_version}, {n} device(s), "
        f"{len(r.live_procs())} live process(es) of {r.proc_num} slot(s)"
    )
    dev = Table(title="devices")
    for col in ("dev", "uuid", "limit", "used", "sm limit"):
        dev.add_column(col, overflow="fold")
    for d in range(n):
        lim = _mib(r.limit[d]) if r.limit[d] else "none"
        sm = f"{r.sm_limit[d]}%" if 0 < r.sm_limit[d] < 100 else "none"
        dev.add_row(str(d), r.uuids[d] or "-", lim, _mib(r.used(d)), sm)
    console.print(dev)
    procs = Table(title="processes")
    for col in ("slot", "pid", "hostpid", "status") + tuple(f"dev{d} used" for d in range(n)):
        procs.add_column(col)
    for p in r.live_procs():
        procs.add_row(str(p.index), str(p.pid), str(p.hostpid), p.status_name, *(_mib(p.used[d]) for d in range(n)))
    console.print(procs)
    when = "never"
    if r.last_kernel_time:
        when = datetime.datetime.fromtimestamp(r.last_kernel_time, datetime.timezone.utc).isoformat()
    console.print(
        f"priority {r.priority}  utilization_switch {r.utilization_switch}  "
        f"recent_kernel {r.recent_kernel}  last_kernel_time {when}"
    )


@click.group("region")
@verbose_option
def cli() -> None:
    """Inspect HAMi shared-region files (CUDA_DEVICE_MEMORY_SHARED_CACHE).

    On a HAMi node the file lives under the container's directory in /usr/local/vgpu/containers/;
    inside the container, $CUDA_DEVICE_MEMORY_SHARED_CACHE names it.

    \b
    Example:
      vgpu-patch region show "$CUDA_DEVICE_MEMORY_SHARED_CACHE"
    """


@cli.command("show")
@verbose_option
@click.argument("file", type=click.Path(dir_okay=False))
@json_option
def show(file: str, as_json: bool) -> None:
    """Decode FILE the way HAMi's monitor does: devices, processes, SM limits, throttling flags.

    Memory in use per device is the sum over live process slots (status != 0), as the monitor counts it.

    \b
    Examples:
      vgpu-patch region show /tmp/cudevshr.cache
      vgpu-patch region show --json /tmp/cudevshr.cache | jq '.devices[0].used'
    """
    with verbosity.step("region", f"read {file}"):
        r = read_region(file)
    if as_json:
        emit_json(r.to_json())
    else:
        _render(r)
