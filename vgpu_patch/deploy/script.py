"""The controller's side of the node program (vgpu_patch/data/node.sh): its exit codes, the parameters and
step calls a swap sends, and the session markers.

node.sh defines every step as a function; a swap is its parameters (`params`) and one call per plan step
(ops.plan_swap), so the plan `--dry-run` shows and the script that runs are the same list. In the one-session
protocol the functions arrive with the probe and the swap sends only parameters and calls; where the swap is
a separate run (sudo with a password or a terminal) `script()` sends the program with them.
"""
from __future__ import annotations

import json
import re
import shlex
from functools import cache

from .facts import node_program


def _codes() -> dict[str, int]:
    """node.sh's `E_NAME=code` lines: one home for the exit codes."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^E_([A-Z]+)=(\d+)", node_program(), re.M)}


_E = _codes()
LOCKED, MISMATCH, NOLOAD, VERIFY, WRITE, UNSAFE, AMBIGUOUS = (
    _E["LOCKED"], _E["MISMATCH"], _E["NOLOAD"], _E["VERIFY"], _E["WRITE"], _E["UNSAFE"], _E["AMBIGUOUS"])


def params(**values: str | int) -> str:
    """Shell assignments of node.sh parameters (each a `shlex.quote`d literal: spaces, colons, quotes are safe)."""
    return "; ".join(f"{k}={shlex.quote(str(v))}" for k, v in values.items())


def jstr(value: str) -> str:
    """A JSON string for a *J parameter (LIVEJ, ACTJ, OPJ, TOOLJ): node.sh writes it into JSON as is."""
    return json.dumps(value)


def script(calls: list[str], *, with_program: bool) -> str:
    """What is sent for a swap: the plan's calls, in order, after the program itself unless the probe's shell
    already defined it (one session)."""
    body = "\n".join(c for c in calls if c) + "\n"
    return node_program() + "\n" + body if with_program else body


@cache
def function_source(name: str) -> str:
    """The text of one node.sh function (`name() {` to its closing `}` at the start of a line), for display."""
    m = re.search(rf"^{re.escape(name)}\(\) {{.*?^}}$", node_program(), re.M | re.S)
    return m.group(0) if m else ""


def code_of(calls: str) -> str:
    """The functions a step's calls run, as node.sh defines them (what `--dry-run --json` shows as `code`)."""
    names = [line.split()[0] for line in calls.splitlines() if line.strip() and "=" not in line.split()[0]]
    return "\n".join(src for src in (function_source(n) for n in names) if src)


# -- one session: the probe, then the swap's calls and its payload on the same stdin ----------------------
# The probe ends with AWAIT: it prints PROBE_END and waits for `@@go N` and an N-byte script, which it runs
# only when it arrived whole (it ends with SCRIPT_END); EOF instead (nothing to do) ends it quietly.
PROBE_END = "@@vgpu end"
SCRIPT_END = "# @@vgpu script end"
RECEIVED = "@@vgpu received"  # printed by node.sh's `pause` (a test seam)
AWAIT = f"""printf '\\n%s\\n' '{PROBE_END}'
while IFS= read -r l; do
  case $l in "@@go "*)
    n=${{l#@@go }}; s=$(head -c "$n")
    case $s in *"{SCRIPT_END}") eval "$s"; exit;; esac
    printf '@@err the swap script arrived cut; nothing changed\\n'; exit {WRITE};;
  esac
done
exit 0
"""

__all__ = ["AWAIT", "PROBE_END", "RECEIVED", "SCRIPT_END", "code_of", "jstr", "params", "script"]
