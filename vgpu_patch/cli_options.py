"""Options shared by several commands, defined once."""
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
