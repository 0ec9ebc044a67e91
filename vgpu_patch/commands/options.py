"""Click options shared by several commands, defined once: output, dry-run, targets and rollout policy."""
from __future__ import annotations

import json
import os
import sys
from typing import IO, Any, Callable

import click

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document on stdout (logs go to stderr)."
)
dry_run_option = click.option(
    "--dry-run", is_flag=True, help="Show the plan and change nothing; exit 1 if changes are pending."
)
stale_option = click.option(
    "--stale-pids", "stale", is_flag=True,
    help="After each swap, list the node's processes still mapping the old library (reads every process's "
         "/proc/PID/maps there; `vgpu-patch status` and `restart-plan` report them at any time).")

allowed_signers_option = click.option(
    "--allowed-signers", type=click.Path(dir_okay=False), default=None, envvar="VGPU_PATCH_ALLOWED_SIGNERS",
    show_envvar=True, metavar="FILE",
    help="Refuse, before anything is uploaded or swapped, a library without a valid OpenSSH signature "
         "(<library>.sig, namespace vgpu-patch) by a key in FILE (ssh-keygen's allowed_signers format; "
         "docs/signing.md).")


SCHEMA_VERSION = 1
_emitted = False  # one document per run: main() prints an error document only when none was


def schema_name(kind: str) -> str:
    """`vgpu-patch/<kind>/<version>`: the `schema` key every --json document carries."""
    return f"vgpu-patch/{kind}/{SCHEMA_VERSION}"


def emit_json(doc: dict[str, Any], kind: str | None = None) -> None:
    """Write exactly one JSON document to stdout, with a `schema` key naming what it is.

    `kind` defaults to the running command's name (`status` -> `vgpu-patch/status/1`). A Kubernetes
    object (`daemonset --json`) is left as it is: its apiVersion and kind are its schema, and
    `kubectl apply` would refuse an unknown top-level field.
    """
    global _emitted
    if "schema" not in doc and "apiVersion" not in doc:
        ctx = click.get_current_context(silent=True)
        doc = {"schema": schema_name(kind or (ctx.info_name if ctx and ctx.info_name else "vgpu-patch")), **doc}
    json.dump(doc, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")
    _emitted = True


def json_emitted() -> bool:
    return _emitted


def error_document(message: str, exit_code: int, command: str | None) -> dict[str, Any]:
    """What --json prints when a run fails before (or instead of) its own document."""
    return {"schema": schema_name("error"), "ok": False, "exit_code": exit_code, "error": message,
            "command": command}


def use_color(stream: IO[str] | None = None) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    if os.environ.get("NO_COLOR"):
        return False
    stream = stream or sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)())


def with_options(*decorators: Callable) -> Callable:
    """Apply several click option decorators in the order given."""

    def apply(f: Callable) -> Callable:
        for d in reversed(decorators):
            f = d(f)
        return f

    return apply


def existing_path(role: str, path: object) -> None:
    """A file named on the command line that does not exist is a usage error (exit 2), in every command."""
    from ..report.errors import UsageError

    if path is not None and not os.path.lexists(str(path)):
        raise UsageError(f"{role} {path} does not exist; check the path")


DEFAULT_TARGET_DIR = "/usr/local/vgpu"  # the same as deploy.request.DEFAULT_DIR (kept import-free for fast --help)


def target_options(f: Callable) -> Callable:
    """Which nodes, and how to reach them (deploy, status, rollback)."""
    opts = [
        click.option("--host", "hosts", multiple=True, metavar="USER@NODE[:PORT]",
                     help="A node to act on (repeatable); names from ~/.ssh/config work too."),
        click.option("--inventory", "-I", "inventory", multiple=True, type=click.Path(),
                     help="An Ansible inventory (any source ansible-core reads: INI, YAML, JSON, a directory "
                          "with group_vars/ and host_vars/, a script), read by ansible-core itself; repeatable. "
                          "vgpu_patch_target_dir sets a host's library dir."),
        click.option("--limit", "-l", metavar="PATTERN",
                     help="Ansible's --limit: hosts, groups, globs, ~regex, a:&b (both), !c (not), @file."),
        click.option("--local", "local_root", is_flag=False, flag_value="/", default=None, metavar="[ROOT]",
                     help="Act on this machine; ROOT is a fake node root directory (default /), symlinks "
                          "resolved inside it."),
        click.option("--target-dir", default=None, metavar="DIR",
                     help=f"The node's library directory [default: {DEFAULT_TARGET_DIR}]."),
        click.option("--ssh-config", type=click.Path(dir_okay=False), default=None,
                     help="OpenSSH client config, resolved by `ssh -G` [default: ~/.ssh/config and "
                          "/etc/ssh/ssh_config]."),
        click.option("--known-hosts", type=click.Path(dir_okay=False), default=None,
                     help="known_hosts file to use instead of UserKnownHostsFile (the global "
                          "/etc/ssh/ssh_known_hosts is read too) [default: ~/.ssh/known_hosts]."),
        click.option("--accept-new-host-keys", is_flag=True,
                     help="Trust and record host keys seen for the first time (a changed or revoked key is "
                          "always refused)."),
        click.option("--identity", "-i", "identities", multiple=True, type=click.Path(dir_okay=False),
                     help="Private key to offer first, as ssh -i (Ansible's -i INVENTORY is -I here); repeatable; "
                          "ssh_config's IdentityFile and the agent are tried too."),
        click.option("--no-sudo", is_flag=True,
                     help="Run node commands as the login user, without sudo (it must own the library dir)."),
        click.option("--ask-become-pass", "-K", is_flag=True,
                     help="Ask once for the sudo password and answer sudo's prompt with it on each node."),
        click.option("--parallel", "-p", default=10, show_default=True, type=click.IntRange(1, 256),
                     help="Nodes worked on at once."),
        click.option("--timeout", "-T", "timeout", type=click.FloatRange(min=0.1), default=None, metavar="S",
                     help="Seconds to wait for a node's SSH connection and login (Ansible's -T) [default: "
                          "ssh_config's ConnectTimeout, else 15]."),
        click.option("--command-timeout", type=click.FloatRange(min=1), default=None, metavar="S",
                     help="Seconds any one command on a node may take before the node fails [default: 120 for "
                          "a probe, 300 for a swap]."),
    ]
    return with_options(*opts)(f)


_VERBOSE_KEY = "vgpu_patch.verbose"


def _add_verbosity(ctx: click.Context, _param: click.Parameter, value: int) -> None:
    """`vgpu-patch -v CMD -v` is -vv: the group's count and the command's add up (ctx.meta is shared by the
    contexts of one run, and fresh in the next)."""
    from ..report import verbosity

    if ctx.resilient_parsing:
        return
    total = ctx.meta.get(_VERBOSE_KEY, 0) + (value or 0)
    ctx.meta[_VERBOSE_KEY] = total
    verbosity.set_level(total)


verbose_option = click.option(
    "--verbose", "-v", "--debug", count=True, expose_value=False, callback=_add_verbosity,
    help="Log each step to stderr with its time: node commands (first line and size) and connections, "
         "compiler runs, API requests, files read; twice (-vv) prints whole commands too. Also before "
         "the command: vgpu-patch -v CMD.")


def fleet_options(f: Callable) -> Callable:
    """Rollout policy (deploy, rollback): batches, failure budget, pauses."""
    opts = [
        click.option("--canary", type=click.IntRange(0), default=None, metavar="N",
                     help="Do N nodes first, then the rest (the same as --batch N,100%) "
                          "[default: 1 when more than one node]."),
        click.option("--batch", "batch", default=None, metavar="SIZES",
                     help="Batch sizes like Ansible's serial, e.g. 1,10%,50%: the last size repeats; each "
                          "batch must pass the failure budget before the next starts."),
        click.option("--max-fail", default=None, metavar="N|N%",
                     help="Failure budget: stop when more than N nodes in all, or more than N% of a batch "
                          "(Ansible's max_fail_percentage), failed [default: 0: stop at the first]."),
        click.option("--pause-between", type=click.FloatRange(0), default=0.0, metavar="S",
                     help="Seconds to wait between batches (soak time before the next batch)."),
        click.option("--keep-going", is_flag=True, help="Carry on whatever fails (no failure budget)."),
    ]
    return with_options(*opts)(f)
