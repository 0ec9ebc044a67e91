"""How OpenSSH would reach a host: `ssh -G` (OpenSSH's own resolution of ssh_config, Match, Include,
defaults and command-line options), with paramiko's SSHConfig as the fallback where no `ssh` client is
installed. Only the options this tool acts on are kept (see SSHOptions).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..report.errors import UsageError

DEFAULT_GLOBAL_KNOWN_HOSTS = ["/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"]
DEFAULT_USER_KNOWN_HOSTS = ["~/.ssh/known_hosts", "~/.ssh/known_hosts2"]


@dataclass
class SSHOptions:
    """The resolved options for one host (names as ssh_config spells them, lower case)."""

    hostname: str
    port: int = 22
    user: str | None = None
    identity_files: list[str] = field(default_factory=list)
    proxy_command: str | None = None
    proxy_jump: str | None = None
    user_known_hosts: list[str] = field(default_factory=lambda: list(DEFAULT_USER_KNOWN_HOSTS))
    global_known_hosts: list[str] = field(default_factory=lambda: list(DEFAULT_GLOBAL_KNOWN_HOSTS))
    connect_timeout: float | None = None
    strict_host_key_checking: str = "ask"  # yes | ask | accept-new | no (as ssh -G prints them)
    host_key_alias: str | None = None
    source: str = "ssh -G"


# What a host or user name from an inventory or --host may hold: it reaches ProxyCommand (%h, %n, %r) and
# paramiko's `Match exec` unquoted, so no shell metacharacter, space or control character; no leading '-'.
_SAFE_NAME = re.compile(r"[A-Za-z0-9_.:%\[\]-]+")
_SAFE_USER = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.@-]*")


def check_names(host: str, user: str | None = None) -> None:
    """UsageError unless `host` (and `user`) are plain names that are safe to hand to a shell."""
    if host.startswith("-") or not _SAFE_NAME.fullmatch(host):
        raise UsageError(f"{host!r}: not a host name (only letters, digits and . _ - : [ ] %); "
                         "fix the inventory or --host")
    if user is not None and not _SAFE_USER.fullmatch(user):
        raise UsageError(f"{host}: user {user!r} is not a user name (only letters, digits and . _ - @); "
                         "fix the inventory or --host")


def _none(v: str | None) -> str | None:
    return None if v is None or v.lower() == "none" else v


def _from_pairs(host: str, pairs: dict[str, list[str]], source: str) -> SSHOptions:
    def one(k: str) -> str | None:
        values = pairs.get(k)
        return values[0] if values else None

    timeout = _none(one("connecttimeout"))
    strict = (one("stricthostkeychecking") or "ask").lower()
    strict = {"true": "yes", "false": "no", "off": "no", "on": "yes"}.get(strict, strict)
    return SSHOptions(
        hostname=one("hostname") or host,
        port=int(one("port") or 22),
        user=one("user"),
        identity_files=[os.path.expanduser(p) for p in pairs.get("identityfile", [])],
        proxy_command=_none(one("proxycommand")),
        proxy_jump=_none(one("proxyjump")),
        user_known_hosts=" ".join(pairs.get("userknownhostsfile", [])).split() or list(DEFAULT_USER_KNOWN_HOSTS),
        global_known_hosts=" ".join(pairs.get("globalknownhostsfile", [])).split() or list(DEFAULT_GLOBAL_KNOWN_HOSTS),
        connect_timeout=float(timeout) if timeout else None,
        strict_host_key_checking=strict,
        host_key_alias=_none(one("hostkeyalias")),
        source=source,
    )


def resolve(
    host: str,
    *,
    port: int | None = None,
    user: str | None = None,
    config: str | None = None,
    identities: Sequence[str] = (),
    extra_args: Sequence[str] = (),
) -> SSHOptions:
    """OpenSSH's view of `host`; what the caller passes (port, user, -i, -o...) wins, as on ssh's command line."""
    check_names(host, user)
    ssh = shutil.which("ssh")
    if ssh is None:
        return _paramiko_resolve(host, port=port, user=user, config=config, identities=identities,
                                 extra_args=extra_args)
    argv = [ssh, "-G"]
    if config:
        argv += ["-F", os.path.expanduser(config)]
    if port:
        argv += ["-p", str(port)]
    if user:
        argv += ["-l", user]
    for key in identities:
        argv += ["-i", os.path.expanduser(key)]
    argv += [*extra_args, "--", host]
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    if proc.returncode != 0:
        why = " ".join(proc.stderr.split())[:300] or f"exit {proc.returncode}"
        raise UsageError(f"{host}: ssh -G could not resolve its ssh_config ({why}); fix the config or --ssh-config")
    pairs: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key:
            pairs.setdefault(key.lower(), []).append(value.strip())
    opts = _from_pairs(host, pairs, "ssh -G")
    # ssh -G lists the default identity files too: keep those that exist (what ssh would offer)
    opts.identity_files = [p for p in opts.identity_files if os.path.exists(p)] or [
        os.path.expanduser(k) for k in identities
    ]
    return opts


def _command_line(args: Sequence[str]) -> dict[str, list[str]]:
    """ssh's command-line options (-p, -l, -i, -J, -F, -o K=V or -o 'K V') as ssh_config pairs."""
    flags = {"-p": "port", "-l": "user", "-i": "identityfile", "-J": "proxyjump", "-F": "-f"}
    out: dict[str, list[str]] = {}
    it = iter(args)
    for flag in it:
        value = next(it, None)
        if value is None:
            break
        if flag == "-o":
            key, _, val = value.replace("=", " ", 1).partition(" ")
            out.setdefault(key.strip().lower(), []).append(val.strip())
        elif flag in flags:
            out.setdefault(flags[flag], []).append(value)
    return out


def _paramiko_resolve(
    host: str, *, port: int | None, user: str | None, config: str | None, identities: Sequence[str],
    extra_args: Sequence[str] = (),
) -> SSHOptions:
    import paramiko

    given = _command_line(extra_args)  # the inventory's ssh args: they win over the file, as in ssh
    files = given.pop("-f", [])
    config = config or (files[0] if files else None)
    path = Path(os.path.expanduser(config or "~/.ssh/config"))
    found: dict = {}
    if path.exists():
        try:
            found = paramiko.SSHConfig.from_path(str(path)).lookup(host)
        except Exception as e:  # paramiko raises several types for malformed files
            raise UsageError(f"{path}: cannot parse ssh config ({e})") from e
    elif config:
        raise UsageError(f"--ssh-config {config}: no such file")
    pairs = {k.lower(): (v if isinstance(v, list) else [str(v)]) for k, v in found.items()}
    pairs.update({k: v for k, v in given.items() if k != "identityfile"})
    if port:
        pairs["port"] = [str(port)]
    if user:
        pairs["user"] = [user]
    pairs["identityfile"] = [*identities, *given.get("identityfile", []), *pairs.get("identityfile", [])]
    opts = _from_pairs(host, pairs, "paramiko SSHConfig")
    opts.identity_files = [p for p in opts.identity_files if os.path.exists(p)] or opts.identity_files
    return opts


def expand_proxy_command(command: str, opts: SSHOptions, host: str) -> str:
    """ssh_config's %-tokens in ProxyCommand: %h host, %p port, %r user, %n the name as given, %% a %."""
    table = {"h": opts.hostname, "p": str(opts.port), "r": opts.user or "", "n": host, "%": "%"}
    out, i = [], 0
    while i < len(command):
        c = command[i]
        if c == "%" and i + 1 < len(command) and command[i + 1] in table:
            out.append(table[command[i + 1]])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)
