"""Which nodes to act on (`--host` specs, `--local`) and how to reach them. Ansible inventories are read by
inventory.py into the same HostSpec (it imports this module, never the other way round).

Precedence for each setting, as with ssh and Ansible: what the host spec or the inventory says (passed
to OpenSSH as command-line options), then the ssh config as `ssh -G` resolves it, then OpenSSH's defaults.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..report.errors import UsageError
from ..transport.base import Transport
from ..transport.sshconfig import SSHOptions, expand_proxy_command
from ..transport.sshconfig import resolve as ssh_resolve


@dataclass
class HostSpec:
    name: str  # how the node is named in output
    hostname: str | None = None  # None: resolve `name` (through ssh_config)
    port: int | None = None
    user: str | None = None
    key_files: list[str] = field(default_factory=list)
    proxy_jump: str | None = None
    ssh_args: list[str] = field(default_factory=list)  # ssh options from the inventory (-o K=V, -J), for ssh -G
    local_root: str | None = None  # set for --local / ansible_connection=local
    target_dir: str | None = None
    use_sudo: bool | None = None  # None: sudo unless root; False: --no-sudo; True: ansible_become=true


# -- --host user@node[:port] ----------------------------------------------------------------------
_HOST_RE = re.compile(
    r"^(?:(?P<user>[^@\s]+)@)?(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:@\s\[\]]+))(?::(?P<port>\d+))?$"
)


def parse_host(text: str) -> HostSpec:
    """`user@node[:port]`, `node`, `[::1]:2222`; UsageError otherwise."""
    m = _HOST_RE.match(text.strip())
    if not m or (m.group("port") and not 0 < int(m.group("port")) < 65536):
        raise UsageError(f"--host {text!r}: expected user@node[:port], e.g. admin@gpu-node-1:22")
    host = m.group("v6") or m.group("host")
    port = int(m.group("port")) if m.group("port") else None
    name = text.strip()
    return HostSpec(name=name, hostname=host, port=port, user=m.group("user"))


# -- ssh_config and transports --------------------------------------------------------------------
@dataclass
class SSHSettings:
    """Client-side settings shared by every node of a run."""

    config: str | None = None  # --ssh-config; None: OpenSSH's defaults (~/.ssh/config, /etc/ssh/ssh_config)
    known_hosts: str | None = None  # --known-hosts: replaces UserKnownHostsFile
    accept_new_host_keys: bool = False
    identities: tuple[str, ...] = ()
    use_sudo: bool | None = None
    become_password: str | None = None
    connect_timeout: float | None = None  # --timeout: wins over ssh_config's ConnectTimeout
    command_timeout: float | None = None  # --command-timeout: each node command's limit


def load_ssh_config(path: Path | str | None) -> SSHSettings:
    """Check an explicit --ssh-config exists; the file itself is read by `ssh -G` for each host."""
    if path and not Path(os.path.expanduser(str(path))).exists():
        raise UsageError(f"--ssh-config {path}: no such file")
    return SSHSettings(config=str(path) if path else None)


def resolve(spec: HostSpec, settings: SSHSettings | None = None) -> SSHOptions:
    """OpenSSH's options for the node: what the spec says wins, then its ssh_config, then defaults."""
    settings = settings or SSHSettings()
    extra = list(spec.ssh_args)
    if spec.proxy_jump:
        extra += ["-J", spec.proxy_jump]
    keys = [*spec.key_files, *settings.identities]
    return ssh_resolve(spec.hostname or spec.name, port=spec.port, user=spec.user, config=settings.config,
                       identities=keys, extra_args=extra)


def make_transport(
    spec: HostSpec,
    *,
    config: SSHSettings | None = None,
    known_hosts: str | None = None,
    accept_new_host_keys: bool = False,
    identity: Iterable[str] = (),
    use_sudo: bool | None = None,
    become_password: str | None = None,
) -> Transport:
    """A lazy transport for one node (nothing connects until the first command)."""
    if spec.local_root is not None:
        from ..transport.local import LocalTransport

        local = LocalTransport(spec.local_root, name=spec.name if spec.local_root == "/" else None)
        local.command_timeout = config.command_timeout if config else None
        return local
    settings = replace(
        config or SSHSettings(), known_hosts=known_hosts or (config.known_hosts if config else None),
        accept_new_host_keys=accept_new_host_keys or bool(config and config.accept_new_host_keys),
        identities=tuple(identity) or (config.identities if config else ()),
        become_password=become_password or (config.become_password if config else None),
    )
    sudo = use_sudo if use_sudo is not None else spec.use_sudo
    return _ssh_transport(spec.name, resolve(spec, settings), settings, use_sudo=sudo, given=spec.hostname or spec.name)


def _ssh_transport(name: str, opts: SSHOptions, settings: SSHSettings, *, use_sudo: bool | None,
                   given: str) -> Transport:

    jump = None
    if opts.proxy_jump and not opts.proxy_command:
        for hop in opts.proxy_jump.split(","):  # a chain: each hop through the previous one
            hs = parse_host(hop)
            hop_opts = ssh_resolve(hs.hostname or hop, port=hs.port, user=hs.user, config=settings.config,
                                   identities=settings.identities)
            jump = _one(hop, hop_opts, settings, jump=jump, use_sudo=False)
    proxy = expand_proxy_command(opts.proxy_command, opts, given) if opts.proxy_command else None
    return _one(name, opts, settings, jump=jump, proxy=proxy, use_sudo=use_sudo)


def _one(name: str, opts: SSHOptions, settings: SSHSettings, *, jump: Transport | None = None,
         proxy: str | None = None, use_sudo: bool | None = None) -> Transport:
    from ..transport.ssh import SSHTransport

    strict = opts.strict_host_key_checking
    return SSHTransport(
        opts.hostname,
        port=opts.port,
        user=opts.user,
        key_filenames=opts.identity_files,
        known_hosts=[settings.known_hosts] if settings.known_hosts else opts.user_known_hosts,
        global_known_hosts=opts.global_known_hosts,
        accept_new_host_keys=settings.accept_new_host_keys or strict in ("accept-new", "no"),
        jump=jump,  # type: ignore[arg-type]
        proxy_command=proxy,
        host_key_alias=opts.host_key_alias,
        connect_timeout=settings.connect_timeout or opts.connect_timeout or 15.0,
        name=name,
        use_sudo=use_sudo,
        become_password=settings.become_password,
        command_timeout=settings.command_timeout,
    )
