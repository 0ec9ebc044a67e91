"""The result of a check: one line per rule, a bitmask exit status, a table and a JSON document."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import click

from ..report.errors import EXIT_INCOMPATIBLE, EXIT_OK

EXIT_WARNINGS = 8  # with --strict: some rule warned (ORed with EXIT_INCOMPATIBLE)
STATUSES = ("pass", "warn", "fail", "info")
JSON_SCHEMA = "vgpu-patch/check/1"
_COLOURS = {"pass": "green", "warn": "yellow", "fail": "red", "info": "blue"}


@dataclass(frozen=True)
class RuleResult:
    name: str
    status: str  # pass | warn | fail | info
    detail: str  # one line: what was found and, when not pass, what to do
    items: tuple[str, ...] = ()  # the full list behind the detail (missing names, extra exports, ...)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "items": list(self.items)}


@dataclass
class Report:
    candidate: str
    vendor: str | None
    arch: str | None
    glibc_floor: str | None
    glibc_floor_source: str  # "--glibc", a libc path, or "none"
    reference: str  # what the exports were compared with, in words
    rules: list[RuleResult] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    strict: bool = False

    def count(self, status: str) -> int:
        return sum(1 for r in self.rules if r.status == status)

    @property
    def ok(self) -> bool:
        return self.count("fail") == 0 and not (self.strict and self.count("warn"))

    @property
    def exit_code(self) -> int:
        code = EXIT_OK
        if self.count("fail"):
            code |= EXIT_INCOMPATIBLE
        if self.strict and self.count("warn"):
            code |= EXIT_WARNINGS
        return code

    def rule(self, name: str) -> RuleResult:
        return next(r for r in self.rules if r.name == name)

    def failed(self) -> list[str]:
        return [r.name for r in self.rules if r.status == "fail"]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": JSON_SCHEMA,
            "candidate": self.candidate,
            "vendor": self.vendor,
            "reference": self.reference,
            "arch": self.arch,
            "glibc_floor": self.glibc_floor,
            "glibc_floor_source": self.glibc_floor_source,
            "strict": self.strict,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "summary": {s: self.count(s) for s in STATUSES},
            "rules": [r.to_json() for r in self.rules],
            "facts": self.facts,
        }


def verdict(report: Report) -> str:
    fails, warns = report.count("fail"), report.count("warn")
    if fails:
        word = "INCOMPATIBLE"
    elif warns:
        word = "NOT OK (--strict counts warnings)" if report.strict else "OK with warnings"
    else:
        word = "OK"
    return f"{word}: {fails} failed, {warns} warned, {report.count('pass')} passed (exit {report.exit_code})"


def render_table(report: Report, color: bool = False) -> str:
    """A readable table, one line per rule; `color` adds ANSI colours (click strips them off a tty)."""
    floor = report.glibc_floor or "none"
    if report.glibc_floor_source not in ("--glibc", "none"):
        floor += f" (from {report.glibc_floor_source})"
    lines = [
        f"check {report.candidate} ({report.arch or '?'})",
        f"  against {report.reference}; glibc floor {floor}",
        "",
    ]
    width = max([len("RULE")] + [len(r.name) for r in report.rules])
    lines.append(f"{'RULE':<{width}}  STATUS  DETAIL")
    for r in report.rules:
        status = f"{r.status:<6}"
        if color:
            status = click.style(status, fg=_COLOURS[r.status], bold=r.status == "fail")
        lines.append(f"{r.name:<{width}}  {status}  {r.detail}")
    lines.append("")
    result = verdict(report)
    if color:
        result = click.style(result, fg="red" if report.count("fail") else "green", bold=True)
    lines.append(result)
    return "\n".join(lines)
