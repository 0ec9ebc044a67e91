"""Options shared by several commands, defined once."""
from __future__ import annotations

import json
import sys
from typing import Any, Callable

import click

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document on stdout (logs go to stderr)."
)
dry_run_option = click.option(
    "--dry-run", is_flag=True, help="Show the plan and change nothing; exit 1 if changes are pending."
)


def emit_json(doc: Any) -> None:
    """Write exactly one JSON document to stdout."""
    json.dump(doc, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def with_options(*decorators: Callable) -> Callable:
    """Apply several click option decorators in the order given."""

    def apply(f: Callable) -> Callable:
        for d in reversed(decorators):
            f = d(f)
        return f

    return apply
