"""Which nodes to act on: `--host` specs, Ansible INI/YAML inventories, `--local`, and ~/.ssh/config.

Precedence for each setting, as operators expect from ssh and Ansible: what the host spec or the
inventory says, then the matching `Host` block of the ssh config, then defaults.
"""
from __future__ import annotations

import fnmatch
import os
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import paramiko

from ..errors import UsageError
from ..transport.base import Transport

TARGET_DIR_VAR = "vgpu_target_dir"  # per-host library dir in an inventory (heterogeneous fleets)


@dataclass
class HostSpec:
    name: str  # how the node is named in output
    hostname: str | None = None  # None: resolve `name` (through ssh_config)
    port: int | None = None
    user: str | None = None
    key_files: list[str] = field(default_factory=list)
    proxy_jump: str | None = None
    local_root: str | None = None  # set for --local / ansible_connection=local
    target_dir: str | None = None
    use_sudo: bool | None = None  # None: sudo unless root; False: --no-sudo; True: ansible_become=true


# -- --host user@node[:port] ----------------------------------------------------------------------
_HOST_RE = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:@\s\[\]]+))"
                      r"(?::(?P<port>\d+))?$")


def parse_host(text: str) -> HostSpec:
    """`user@node[:port]`, `node`, `[::1]:2222`; UsageError otherwise."""
    m = _HOST_RE.match(text.strip())
    if not m or (m.group("port") and not 0 < int(m.group("port")) < 65536):
        raise UsageError(f"--host {text!r}: expected user@node[:port], e.g. admin@gpu-node-1:22")
    host = m.group("v6") or m.group("host")
    port = int(m.group("port")) if m.group("port") else None
    name = text.strip()
    return HostSpec(name=name, hostname=host, port=port, user=m.group("user"))


# -- Ansible inventories ----------------------------------------------------------------------------
@dataclass
class _Group:
    hosts: dict[str, dict] = field(default_factory=dict)
    vars: dict = field(default_factory=dict)
    children: list[str] = field(default_factory=list)


def _expand(pattern: str) -> list[str]:
    """Ansible host ranges: `node[01:03]`, `rack-[a:c]`."""
    m = re.search(r"\[([0-9a-z]+):([0-9a-z]+)(?::(\d+))?\]", pattern)
    if not m:
        return [pattern]
    lo, hi, step = m.group(1), m.group(2), int(m.group(3) or 1)
    if lo.isdigit() and hi.isdigit():
        width = len(lo) if lo.startswith("0") else 0
        values = [str(i).zfill(width) for i in range(int(lo), int(hi) + 1, step)]
    else:
        values = [chr(c) for c in range(ord(lo), ord(hi) + 1, step)]
    head, tail = pattern[: m.start()], pattern[m.end() :]
    return [h for v in values for h in _expand(head + v + tail)]


def _parse_value(v: str) -> object:
    if re.fullmatch(r"-?\d+", v):
        return int(v)
    return v


def _parse_ini(text: str, path: Path) -> dict[str, _Group]:
    groups: dict[str, _Group] = {"all": _Group(), "ungrouped": _Group()}
    section, kind = "ungrouped", "hosts"
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            name, _, kind = line[1:-1].partition(":")
            kind = kind or "hosts"
            if kind not in ("hosts", "vars", "children"):
                raise UsageError(f"{path}:{n}: unknown section kind {kind!r}; expected :vars or :children")
            section = name
            groups.setdefault(section, _Group())
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError as e:
            raise UsageError(f"{path}:{n}: cannot parse {line!r} ({e})") from e
        if not words:
            continue
        g = groups[section]
        if kind == "vars":
            key, _, value = line.partition("=")
            g.vars[key.strip()] = _parse_value(value.strip().strip("'\""))
        elif kind == "children":
            g.children.append(words[0])
            groups.setdefault(words[0], _Group())
        else:
            hvars = {}
            for w in words[1:]:
                key, eq, value = w.partition("=")
                if not eq:
                    raise UsageError(f"{path}:{n}: expected key=value after the host name, got {w!r}")
                hvars[key] = _parse_value(value)
            for h in _expand(words[0]):
                g.hosts.setdefault(h, {}).update(hvars)
    return groups


def _parse_yaml(text: str, path: Path) -> dict[str, _Group]:
    import yaml

    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise UsageError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from e
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: a YAML inventory is a mapping of groups (all: hosts: ...)")
    groups: dict[str, _Group] = {"all": _Group(), "ungrouped": _Group()}

    def walk(name: str, body: object) -> None:
        g = groups.setdefault(name, _Group())
        if not isinstance(body, dict):
            return
        for h, hv in (body.get("hosts") or {}).items():
            for hn in _expand(str(h)):
                g.hosts.setdefault(hn, {}).update(hv or {})
        g.vars.update(body.get("vars") or {})
        for child, cbody in (body.get("children") or {}).items():
            if child not in g.children:
                g.children.append(child)
            walk(child, cbody)

    for name, body in doc.items():
        walk(str(name), body)
    return groups


def _descendants(groups: dict[str, _Group], name: str, seen: set[str] | None = None) -> list[str]:
    seen = seen if seen is not None else set()
    if name in seen or name not in groups:
        return []
    seen.add(name)
    out = [name]
    for c in groups[name].children:
        out += _descendants(groups, c, seen)
    return out


def _ancestry(groups: dict[str, _Group], host: str) -> list[str]:
    """Groups a host belongs to, parents before children (later ones win when merging vars)."""
    direct = [g for g, body in groups.items() if host in body.hosts]
    order: list[str] = []

    def parents_first(g: str, trail: tuple[str, ...] = ()) -> None:
        if g in trail:
            return
        for p, body in groups.items():
            if g in body.children:
                parents_first(p, trail + (g,))
        if g not in order:
            order.append(g)

    for g in direct:
        parents_first(g)
    return ["all"] + [g for g in order if g != "all"]


def load_inventory(path: Path | str, limit: str | None = None) -> list[HostSpec]:
    """Hosts of an Ansible INI or YAML inventory, narrowed by `--limit` (groups, hosts, globs, `!excl`)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise UsageError(f"--inventory {path}: cannot read ({e.strerror})") from e
    is_yaml = path.suffix in (".yml", ".yaml") or text.lstrip().startswith(("all:", "---"))
    groups = _parse_yaml(text, path) if is_yaml else _parse_ini(text, path)
    ordered: list[str] = []
    for body in groups.values():
        for h in body.hosts:
            if h not in ordered:
                ordered.append(h)
    selected = _apply_limit(groups, ordered, limit) if limit else ordered
    specs = []
    for h in selected:
        hv: dict = {}
        for g in _ancestry(groups, h):
            hv.update(groups[g].vars)
        for body in groups.values():
            hv.update(body.hosts.get(h, {}))
        specs.append(_spec_from_vars(h, hv))
    if not specs:
        raise UsageError(f"--inventory {path}: no hosts" + (f" match --limit {limit}" if limit else ""))
    return specs


def _apply_limit(groups: dict[str, _Group], ordered: list[str], limit: str) -> list[str]:
    include: set[str] = set()
    exclude: set[str] = set()
    any_include = False
    for pat in re.split(r"[,:]", limit):
        pat = pat.strip()
        if not pat:
            continue
        neg = pat.startswith("!")
        pat = pat.lstrip("!")
        hits: set[str] = set()
        for g in groups:
            if fnmatch.fnmatchcase(g, pat):
                for d in _descendants(groups, g):
                    hits |= set(groups[d].hosts)
        hits |= {h for h in ordered if fnmatch.fnmatchcase(h, pat)}
        if pat == "all":
            hits = set(ordered)
        if neg:
            exclude |= hits
        else:
            any_include = True
            include |= hits
    base = include if any_include else set(ordered)
    return [h for h in ordered if h in base and h not in exclude]


def _spec_from_vars(name: str, hv: dict) -> HostSpec:
    spec = HostSpec(name=name)
    if hv.get("ansible_connection") == "local":
        spec.local_root = "/"
    spec.hostname = str(hv["ansible_host"]) if hv.get("ansible_host") else None
    if hv.get("ansible_port"):
        spec.port = int(hv["ansible_port"])
    if hv.get("ansible_user"):
        spec.user = str(hv["ansible_user"])
    key = hv.get("ansible_ssh_private_key_file") or hv.get("ansible_private_key_file")
    if key:
        spec.key_files = [str(key)]
    args = " ".join(str(hv.get(k, "")) for k in ("ansible_ssh_common_args", "ansible_ssh_extra_args"))
    m = re.search(r"(?:-J\s*|ProxyJump[= ])([^\s'\"]+)", args)
    if m:
        spec.proxy_jump = m.group(1)
    if str(hv.get("ansible_become", "")).lower() in ("1", "true", "yes"):
        spec.use_sudo = True  # escalate even as root; anything else: sudo unless root
    if hv.get(TARGET_DIR_VAR):
        spec.target_dir = str(hv[TARGET_DIR_VAR])
    return spec


# -- ssh_config and transports --------------------------------------------------------------------
def load_ssh_config(path: Path | str | None) -> paramiko.SSHConfig | None:
    """The ssh config (default ~/.ssh/config); None when there is none."""
    p = Path(os.path.expanduser(str(path or "~/.ssh/config")))
    if not p.exists():
        if path:
            raise UsageError(f"--ssh-config {path}: no such file")
        return None
    try:
        return paramiko.SSHConfig.from_path(str(p))
    except Exception as e:  # paramiko raises several types for malformed files
        raise UsageError(f"{p}: cannot parse ssh config ({e})") from e


def resolve(spec: HostSpec, config: paramiko.SSHConfig | None) -> HostSpec:
    """Fill what the spec leaves open from the matching ssh config `Host` block."""
    if spec.local_root is not None:
        return spec
    lookup_name = spec.hostname or spec.name
    found: dict = config.lookup(lookup_name) if config else {}
    return replace(
        spec,
        hostname=spec.hostname if spec.hostname and "hostname" not in found else found.get("hostname", lookup_name),
        port=spec.port or int(found.get("port", 22)),
        user=spec.user or found.get("user"),
        key_files=spec.key_files or [os.path.expanduser(k) for k in found.get("identityfile", [])],
        proxy_jump=spec.proxy_jump or (found.get("proxyjump") if found.get("proxyjump", "none") != "none" else None),
    )


def make_transport(
    spec: HostSpec,
    *,
    config: paramiko.SSHConfig | None = None,
    known_hosts: str | None = None,
    accept_new_host_keys: bool = False,
    identity: Iterable[str] = (),
    use_sudo: bool | None = None,
) -> Transport:
    """A lazy transport for one node (nothing connects until the first command)."""
    if spec.local_root is not None:
        from ..transport.local import LocalTransport

        return LocalTransport(spec.local_root, name=spec.name if spec.local_root == "/" else None)
    from ..transport.ssh import SSHTransport

    spec = resolve(spec, config)
    common = dict(known_hosts=known_hosts, accept_new_host_keys=accept_new_host_keys)
    jump = None
    if spec.proxy_jump:
        for hop in spec.proxy_jump.split(","):  # a chain: each hop through the previous one
            hs = resolve(replace(parse_host(hop), name=hop), config)
            jump = SSHTransport(
                hs.hostname or hop, port=hs.port or 22, user=hs.user, key_filenames=hs.key_files or list(identity),
                jump=jump, name=hop, **common,  # type: ignore[arg-type]
            )
    return SSHTransport(
        spec.hostname or spec.name,
        port=spec.port or 22,
        user=spec.user,
        key_filenames=spec.key_files or list(identity),
        jump=jump,
        name=spec.name,
        use_sudo=use_sudo if use_sudo is not None else spec.use_sudo,
        **common,  # type: ignore[arg-type]
    )
