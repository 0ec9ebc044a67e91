"""Human output: summary tables (rich; colours only on a terminal) for fleet results and status.

rich is imported when a table is drawn: a `--json` run never pays for it.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from .fleet import FleetResult

if TYPE_CHECKING:
    from rich.console import Console

    from .swap import NodeStatus, SwapResult

_STYLE = {"changed": "green", "unchanged": "cyan", "ok": "green", "pending": "yellow", "failed": "bold red",
          "skipped": "dim"}


def _console(err: bool = False) -> Console:
    from rich.console import Console

    stream = sys.stderr if err else sys.stdout
    return Console(file=stream, highlight=False, soft_wrap=True, width=None if stream.isatty() else 200)


def _short(sha: str | None) -> str:
    return sha[:12] if sha else "-"


def swap_table(fleet: FleetResult[SwapResult], title: str) -> None:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for col in ("node", "result", "from", "to", "restart needed", "s", "detail"):
        table.add_column(col, overflow="fold")
    for o in fleet.outcomes:
        r = o.result
        stale = len(r.stale_pids) if r is not None else 0
        detail = o.error or ""
        if r is not None and not detail:
            if o.status == "pending":
                detail = "; ".join(s.text for s in r.plan if s.kind not in ("prepare", "report"))
            elif r.plan and r.plan[0].kind == "noop":
                detail = r.plan[0].text
            elif r.path:
                detail = r.path
        table.add_row(
            o.node,
            f"[{_STYLE.get(o.status, '')}]{o.status}[/]",
            _short(r.from_sha256 if r is not None else None),
            _short(r.to_sha256 if r is not None else None),
            f"{stale} process(es)" if stale else "-",
            f"{o.seconds:.2f}",
            detail,
        )
    _console().print(table)
    counts = fleet.to_dict()["counts"]
    _console().print(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))


def plan_listing(fleet: FleetResult[SwapResult], title: str, *, commands: bool = False) -> None:
    """`--dry-run`: per node, the numbered steps that would run (as `terraform plan` and `ansible --check` show
    them); with `commands`, each step's shell under it. `--dry-run --json` carries the same steps."""
    import shutil
    import textwrap

    width = shutil.get_terminal_size((120, 24)).columns if sys.stdout.isatty() else 120
    out = [title]
    for o in fleet.outcomes:
        r = o.result
        head = f"{o.node}: {o.status}"
        if r is not None and r.to_sha256:
            head += f", {_short(r.from_sha256)} -> {_short(r.to_sha256)}"
        if r is not None and r.path:
            head += f" ({r.path})"
        out += ["", head]
        if o.error:
            out += textwrap.wrap(o.error, width, initial_indent="  ", subsequent_indent="  ")
            continue
        plan = list(r.plan) if r is not None else []
        if plan and plan[0].kind == "noop":
            out += textwrap.wrap(plan[0].text, width, initial_indent="  ", subsequent_indent="  ")
            continue
        steps = plan if commands else [st for st in plan if st.kind not in ("prepare", "report")]
        for i, st in enumerate(steps, 1):
            lead = f"  {i:>2}. {st.kind:<7} "
            out += textwrap.wrap(st.text, width, initial_indent=lead, subsequent_indent=" " * len(lead),
                                 break_on_hyphens=False, break_long_words=False)
            if commands and st.sh:
                out += [f"{' ' * len(lead)}| {line}" for line in st.sh.splitlines()]
    counts = fleet.to_dict()["counts"]
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    if counts.get("pending") and not commands:
        summary += " (-v shows each step's shell; run without --dry-run to apply)"
    elif counts.get("pending"):
        summary += " (run without --dry-run to apply)"
    print("\n".join([*out, "", summary]))


def status_table(fleet: FleetResult[NodeStatus]) -> None:
    from rich.table import Table

    table = Table(title="vgpu-patch status", title_justify="left")
    for col in ("node", "live file", "sha256", "build", "signed by", "backups", "last change", "restart needed",
                "note"):
        table.add_column(col, overflow="fold")
    for o in fleet.outcomes:
        s = o.result
        if s is None:
            table.add_row(o.node, "-", "-", "-", "-", "-", "-", "-", f"[bold red]{o.error}[/]")
            continue
        last = s.history[-1] if s.history else None
        last_txt = f"{last.get('action')} {last.get('time')} by {last.get('operator')}" if last else "-"
        build = f"ours {s.version}" if s.ours else ("vendor" if s.sha256 else "-")
        stale = len(s.stale_pids)
        signed = s.signer.get("principal", "?") if s.signer else ("unsigned" if s.sha256 else "-")
        table.add_row(
            o.node, s.path or "-", _short(s.sha256), build, str(signed), str(len(s.backups)), last_txt,
            f"[yellow]{stale} process(es)[/]" if stale else "0", s.problem or "",
        )
    _console().print(table)
