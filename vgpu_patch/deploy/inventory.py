"""Ansible inventories read by ansible-core itself: selection and variables exactly as Ansible sees them.

`InventoryManager` parses every source Ansible can (INI, YAML, JSON, a directory, an executable script
printing JSON, `host1,host2,` lists) and applies `--limit` with Ansible's own pattern rules (`a:&b`,
`!c`, globs, `~regex`, `@retry-file`). `VariableManager` merges `all`/group/host vars with the
`group_vars/` and `host_vars/` next to the inventory, and a `Templar` renders `{{ ... }}` in the few
variables used here. ansible-core is imported lazily: it is only needed when `--inventory` is given
(the [inventory] extra; `install.extra_hint` names the pip command for this install).
"""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

from ..report.errors import UsageError
from .targets import HostSpec

TARGET_DIR_VAR = "vgpu_patch_target_dir"  # the library dir per host; the Ansible role reads the same variable
OLD_TARGET_DIR_VAR = "vgpu_target_dir"  # accepted, with a deprecation line
_USED = (
    "ansible_host", "ansible_ssh_host", "ansible_port", "ansible_ssh_port", "ansible_user", "ansible_ssh_user",
    "ansible_connection", "ansible_ssh_private_key_file", "ansible_private_key_file", "ansible_ssh_common_args",
    "ansible_ssh_extra_args", "ansible_become", TARGET_DIR_VAR, OLD_TARGET_DIR_VAR,
)
_warned_old_var = False


def _ansible() -> Any:
    try:
        from ansible.errors import AnsibleError  # type: ignore[import-untyped,attr-defined,unused-ignore]
        from ansible.inventory.manager import InventoryManager  # type: ignore[import-untyped,attr-defined,unused-ignore]
        from ansible.parsing.dataloader import DataLoader  # type: ignore[import-untyped,attr-defined,unused-ignore]
        from ansible.template import Templar  # type: ignore[import-untyped,attr-defined,unused-ignore]
        from ansible.vars.manager import VariableManager  # type: ignore[import-untyped,attr-defined,unused-ignore]

        from ansible import constants  # type: ignore[import-untyped,attr-defined,unused-ignore]
    except ImportError as e:
        from ..release.install import extra_hint

        raise UsageError(
            f"--inventory needs ansible-core to read the inventory as Ansible does ({e}): "
            f"{extra_hint('inventory')}, or pass nodes with --host"
        ) from e
    return constants, AnsibleError, InventoryManager, DataLoader, Templar, VariableManager


def _one_line(e: BaseException) -> str:
    text = " ".join(str(getattr(e, "message", None) or e).split())
    return text[:300]


def load_inventory(sources: str | Path | list[str | Path], limit: str | None = None) -> list[HostSpec]:
    """The hosts Ansible would act on for `all` with `--limit limit`, in Ansible's order, with their vars."""
    srcs = [str(s) for s in (sources if isinstance(sources, list) else [sources])]
    for s in srcs:
        if "," not in s and not os.path.exists(s):
            raise UsageError(f"--inventory {s}: no such file or directory")
    constants, AnsibleError, InventoryManager, DataLoader, Templar, VariableManager = _ansible()
    # set on ansible-core's constants, never in os.environ (child processes must not inherit them)
    constants.INVENTORY_UNPARSED_IS_FAILED = True  # a source nobody can parse: an error, not a warning
    constants.HOST_PATTERN_MISMATCH = "ignore"  # --limit matching nothing: our own one-line error
    loader = DataLoader()
    try:
        inventory = InventoryManager(loader=loader, sources=srcs)
        if limit:
            inventory.subset(limit)
        hosts = inventory.get_hosts("all")
        variables = VariableManager(loader=loader, inventory=inventory)
        specs = [_spec(h.name, _host_vars(variables, loader, Templar, h)) for h in hosts]
    except AnsibleError as e:
        raise UsageError(f"--inventory {', '.join(srcs)}: {_one_line(e)}") from e
    if not specs:
        raise UsageError(f"--inventory {', '.join(srcs)}: no hosts" + (f" match --limit {limit}" if limit else ""))
    return specs


def _host_vars(variables: Any, loader: Any, templar_cls: Any, host: Any) -> dict[str, Any]:
    hv = variables.get_vars(host=host, include_hostvars=False)
    templar = templar_cls(loader=loader, variables=hv)
    return {k: templar.template(hv[k]) for k in _USED if hv.get(k) not in (None, "")}


def _warn_old_var(host: str) -> None:
    global _warned_old_var
    if not _warned_old_var:
        _warned_old_var = True
        print(f"vgpu-patch: warning: {host}: inventory variable {OLD_TARGET_DIR_VAR} is deprecated; "
              f"rename it to {TARGET_DIR_VAR} (the Ansible role reads that one too)", file=sys.stderr)


def _spec(name: str, hv: dict[str, Any]) -> HostSpec:
    spec = HostSpec(name=name)
    if hv.get("ansible_connection") == "local":
        spec.local_root = "/"
    host = hv.get("ansible_host") or hv.get("ansible_ssh_host")
    spec.hostname = str(host) if host else None
    port = hv.get("ansible_port") or hv.get("ansible_ssh_port")
    if port:
        try:
            spec.port = int(port)
        except (TypeError, ValueError) as e:
            raise UsageError(f"{name}: ansible_port={port!r} is not a port number") from e
    user = hv.get("ansible_user") or hv.get("ansible_ssh_user")
    spec.user = str(user) if user else None
    key = hv.get("ansible_ssh_private_key_file") or hv.get("ansible_private_key_file")
    if key:
        spec.key_files = [os.path.expanduser(str(key))]
    args = " ".join(str(hv.get(k, "")) for k in ("ansible_ssh_common_args", "ansible_ssh_extra_args"))
    try:
        spec.ssh_args = _ssh_options(shlex.split(args))
    except ValueError as e:
        raise UsageError(f"{name}: cannot split ansible_ssh_common_args/extra_args ({e})") from e
    if str(hv.get("ansible_become", "")).lower() in ("1", "true", "yes"):
        spec.use_sudo = True  # escalate even as root; anything else: sudo unless root
    if hv.get(TARGET_DIR_VAR):
        spec.target_dir = str(hv[TARGET_DIR_VAR])
    elif hv.get(OLD_TARGET_DIR_VAR):
        _warn_old_var(name)
        spec.target_dir = str(hv[OLD_TARGET_DIR_VAR])
    return spec


_WITH_VALUE = {"-o", "-J", "-F", "-i", "-p", "-l"}


def _ssh_options(words: list[str]) -> list[str]:
    """The ssh arguments that change how a host is reached (`-o K=V`, `-J`, `-i`...), for `ssh -G`."""
    out: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        if w in _WITH_VALUE and i + 1 < len(words):
            out += [w, words[i + 1]]
            i += 2
            continue
        if len(w) > 2 and w[:2] in _WITH_VALUE:
            out += [w[:2], w[2:]]
        i += 1
    return out
