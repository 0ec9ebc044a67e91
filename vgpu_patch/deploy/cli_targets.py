"""What the shared target and policy options (commands/options.py) turn into: node specs, transports, a Policy."""
from __future__ import annotations

import getpass
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

import click

from ..report.errors import UsageError
from ..transport.base import Transport
from .fleet import NodeOutcome, Policy
from .inventory import load_inventory
from .request import DEFAULT_DIR
from .targets import HostSpec, SSHSettings, load_ssh_config, make_transport, parse_host


@dataclass
class Targets:
    specs: list[HostSpec]
    connect: Callable[[HostSpec], Transport]
    target_dir: str

    def dir_for(self, spec: HostSpec) -> str:
        return spec.target_dir or self.target_dir


def _inventory_given_as_identity(identities: tuple[str, ...] | list[str]) -> str | None:
    """An `-i FILE` that is an inventory, not a key: Ansible's `-i` is vgpu-patch's `-I` (`-i` is ssh's)."""
    for path in identities:
        if path.endswith((".ini", ".yml", ".yaml", ".json", ".cfg", ".txt")) or os.path.isdir(path):
            return path
        try:
            with open(path, "rb") as f:
                head = f.read(4096)
        except OSError:
            continue
        if b"PRIVATE KEY" not in head and (b"[" in head or b"ansible_" in head or b"hosts:" in head):
            return path
    return None


def _inventory_hint(kw: dict) -> str:
    path = _inventory_given_as_identity(tuple(kw.get("identities") or ()))
    if path is None:
        return ""
    return (f"; `-i {path}` is --identity (a private key, as in ssh -i): for an Ansible inventory use "
            f"`-I {path}` (--inventory)")


def resolve_targets(kw: dict) -> Targets:
    """Turn the shared options into node specs and a transport factory; UsageError when none given."""
    specs: list[HostSpec] = []
    if kw.get("local_root") is not None:
        specs.append(HostSpec(name="local" if kw["local_root"] == "/" else f"local:{kw['local_root']}",
                              local_root=kw["local_root"]))
    specs += [parse_host(h) for h in kw.get("hosts") or ()]
    inventories = kw.get("inventory") or ()
    if isinstance(inventories, str):
        inventories = (inventories,)
    if inventories:
        specs += load_inventory(list(inventories), kw.get("limit"))
    elif kw.get("limit"):
        raise UsageError("--limit needs --inventory (-I FILE)" + _inventory_hint(kw))
    if not specs:
        raise UsageError("no target: give --host USER@NODE, --inventory (-I) FILE or --local [ROOT]"
                         + _inventory_hint(kw))
    bad_key = _inventory_given_as_identity(tuple(kw.get("identities") or ()))
    if bad_key:
        raise UsageError(f"--identity (-i) {bad_key} looks like an inventory, not a private key"
                         + _inventory_hint(kw))
    names = [s.name for s in specs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise UsageError(f"node given twice: {', '.join(sorted(dup))}")
    ssh_needed = any(s.local_root is None for s in specs)
    settings = load_ssh_config(kw.get("ssh_config")) if ssh_needed else SSHSettings()
    password = None
    if kw.get("ask_become_pass") and ssh_needed:
        password = click.prompt("BECOME password (sudo on the nodes)", hide_input=True, err=True)
    settings = SSHSettings(config=settings.config, known_hosts=kw.get("known_hosts"),
                           accept_new_host_keys=bool(kw.get("accept_new_host_keys")),
                           identities=tuple(kw.get("identities") or ()),
                           use_sudo=False if kw.get("no_sudo") else None, become_password=password,
                           connect_timeout=kw.get("timeout"), command_timeout=kw.get("command_timeout"))

    def connect(spec: HostSpec) -> Transport:
        return make_transport(spec, config=settings, use_sudo=settings.use_sudo)

    return Targets(specs, connect, kw.get("target_dir") or DEFAULT_DIR)


def policy_from(kw: dict, n: int) -> Policy:
    """The rollout policy of fleet_options."""
    return Policy.from_options(n=n, batch=kw.get("batch"), canary=kw.get("canary"), max_fail=kw.get("max_fail"),
                               keep_going=bool(kw.get("keep_going")), pause_between=float(kw.get("pause_between") or 0))


def default_operator() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no login name in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@contextmanager
def progress(total: int, label: str) -> Iterator[Callable[[NodeOutcome[Any]], None]]:
    """A progress bar on stderr when it is a terminal; a silent callback otherwise."""
    if total < 2 or not sys.stderr.isatty():
        yield lambda o: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(file=sys.stderr), transient=True) as bar:
        task = bar.add_task(label, total=total)

        def done(o: NodeOutcome[Any]) -> None:
            bar.advance(task)
            if o.status == "failed":
                bar.console.print(f"[red]{o.node}: {o.error}[/]")

        yield done
