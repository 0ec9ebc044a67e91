"""Click options shared by deploy, status and rollback: which nodes, how to reach them, how many at once."""
from __future__ import annotations

import getpass
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import click

from ..errors import UsageError
from ..transport.base import Transport
from .fleet import NodeOutcome
from .swap import DEFAULT_DIR
from .targets import HostSpec, load_inventory, load_ssh_config, make_transport, parse_host


def target_options(f: Callable) -> Callable:
    opts = [
        click.option("--host", "hosts", multiple=True, metavar="USER@NODE[:PORT]",
                     help="A node to act on (repeatable); names from ~/.ssh/config work too."),
        click.option("--inventory", "-I", "inventory", type=click.Path(dir_okay=False),
                     help="An Ansible INI or YAML inventory (ansible_host/port/user/ssh_private_key_file, "
                          "and vgpu_target_dir per host)."),
        click.option("--limit", "-l", metavar="PATTERN",
                     help="Only these inventory groups or hosts (comma-separated, globs, !exclude)."),
        click.option("--local", "local_root", is_flag=False, flag_value="/", default=None, metavar="[ROOT]",
                     help="Act on this machine; ROOT is a fake node root directory (default /)."),
        click.option("--target-dir", default=None, metavar="DIR",
                     help=f"The node's library directory [default: {DEFAULT_DIR}]."),
        click.option("--ssh-config", type=click.Path(dir_okay=False), default=None,
                     help="OpenSSH client config to honour [default: ~/.ssh/config]."),
        click.option("--known-hosts", type=click.Path(dir_okay=False), default=None,
                     help="known_hosts file used to verify host keys [default: ~/.ssh/known_hosts]."),
        click.option("--accept-new-host-keys", is_flag=True,
                     help="Trust and record host keys seen for the first time (a changed key is always refused)."),
        click.option("--identity", "-i", "identities", multiple=True, type=click.Path(dir_okay=False),
                     help="Private key to use when the host has none configured (repeatable; the agent is tried too)."),
        click.option("--no-sudo", is_flag=True,
                     help="Run node commands as the login user, without sudo (it must own the library dir)."),
        click.option("--parallel", "-p", default=10, show_default=True, type=click.IntRange(1, 256),
                     help="Nodes worked on at once."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def fleet_options(f: Callable) -> Callable:
    f = click.option("--keep-going", is_flag=True, help="Carry on after a node fails (default: stop at the first).")(f)
    f = click.option("--canary", type=click.IntRange(0), default=None, metavar="N",
                     help="Do N nodes first and stop if one fails [default: 1 when more than one node].")(f)
    return f


@dataclass
class Targets:
    specs: list[HostSpec]
    connect: Callable[[HostSpec], Transport]
    target_dir: str

    def dir_for(self, spec: HostSpec) -> str:
        return spec.target_dir or self.target_dir


def resolve_targets(kw: dict) -> Targets:
    """Turn the shared options into node specs and a transport factory; UsageError when none given."""
    specs: list[HostSpec] = []
    if kw.get("local_root") is not None:
        specs.append(HostSpec(name="local" if kw["local_root"] == "/" else f"local:{kw['local_root']}",
                              local_root=kw["local_root"]))
    specs += [parse_host(h) for h in kw.get("hosts") or ()]
    if kw.get("inventory"):
        specs += load_inventory(kw["inventory"], kw.get("limit"))
    elif kw.get("limit"):
        raise UsageError("--limit needs --inventory")
    if not specs:
        raise UsageError("no target: give --host USER@NODE, --inventory FILE or --local [ROOT]")
    names = [s.name for s in specs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise UsageError(f"node given twice: {', '.join(sorted(dup))}")
    ssh_needed = any(s.local_root is None for s in specs)
    config = load_ssh_config(kw.get("ssh_config")) if ssh_needed else None

    def connect(spec: HostSpec) -> Transport:
        return make_transport(spec, config=config, known_hosts=kw.get("known_hosts"),
                              accept_new_host_keys=kw.get("accept_new_host_keys", False),
                              identity=kw.get("identities") or (),
                              use_sudo=False if kw.get("no_sudo") else None)

    return Targets(specs, connect, kw.get("target_dir") or DEFAULT_DIR)


def default_operator() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no login name in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@contextmanager
def progress(total: int, label: str) -> Iterator[Callable[[NodeOutcome], None]]:
    """A progress bar on stderr when it is a terminal; a silent callback otherwise."""
    if total < 2 or not sys.stderr.isatty():
        yield lambda o: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(file=sys.stderr), transient=True) as bar:
        task = bar.add_task(label, total=total)

        def done(o: NodeOutcome) -> None:
            bar.advance(task)
            if o.status == "failed":
                bar.console.print(f"[red]{o.node}: {o.error}[/]")

        yield done
