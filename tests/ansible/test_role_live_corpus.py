"""The live-file rule through the Ansible role (status.yml, then deploy.yml): the corpus of tests/live_corpus.py,
every case a host of one inventory (aliases of the module's sshd nodes, each with its own library dir)."""
from __future__ import annotations

import re
import sys
from contextlib import ExitStack
from pathlib import Path

from fleet_helpers import Libs, Node, _ini_quote, run_playbook
from live_corpus import CASES, check_outcome, lay_out, mapping, snapshot


def test_role_swaps_the_file_hami_mounts(nodes: list[Node], libs: Libs, tmp_path: Path) -> None:
    lines, dirs = ["[gpu]"], {}
    for i, case in enumerate(CASES):
        libdir = tmp_path / case.id / "usr/local/vgpu"
        lay_out(case, libdir, libs.vendor)
        dirs[case.id] = libdir
        sshd = nodes[i % len(nodes)].sshd
        lines.append(f"{case.id} {sshd.inventory_vars()} vgpu_patch_target_dir={_ini_quote(str(libdir))} "
                     f"ansible_python_interpreter={sys.executable}")
    inv = tmp_path / "inv.ini"
    inv.write_text("\n".join(lines) + "\n")
    before = {c.id: snapshot(dirs[c.id]) for c in CASES}
    with ExitStack() as maps:
        for c in CASES:
            maps.enter_context(mapping(c, dirs[c.id]))
        status = run_playbook("status.yml", inv)
        run = run_playbook("deploy.yml", inv, {"vgpu_patch_library": str(libs.v2), "vgpu_patch_serial": "100%",
                                               "vgpu_patch_max_fail_percentage": 100})
    for case in CASES:
        # the host's own lines: its task results and failure messages name it
        own = "\n".join(ln for ln in run.output.splitlines() if case.id in ln) + "\n" + _failure(run.output, case.id)
        ok = run.recap[case.id]["failed"] == 0
        check_outcome(case, before[case.id], dirs[case.id], libs.v2.read_bytes(), ok, own)
        if case.live is not None:
            assert re.search(rf'"live_path": "{re.escape(str(dirs[case.id]))}/{re.escape(case.live)}"',
                             _block(status.output, case.id)), case.id
        else:
            assert status.recap[case.id]["failed"] == 1 and case.refuse in _failure(status.output, case.id)


def _failure(output: str, host: str) -> str:
    """The failure message ansible printed for `host` (the `fatal: [host]: ...` line and what follows)."""
    return "\n".join(m.group(0) for m in re.finditer(rf"fatal: \[{re.escape(host)}\].*(?:\n(?!\S).*)*", output))


def _block(output: str, host: str) -> str:
    """The debug block ansible printed for `host` (`ok: [host] => {...}`)."""
    m = re.search(rf"ok: \[{re.escape(host)}\] => \{{\n(?:.*\n)*?\}}", output)
    return m.group(0) if m else ""
