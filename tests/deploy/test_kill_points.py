"""A swap SIGKILLed after any one command it runs under the lock: the node keeps a whole file, the history
says what is live, a rerun finishes the job and a rollback goes back to the file before it.

Every tool node.sh calls is a wrapper (first on PATH) that runs the real tool and then, when it is the k-th
command since the lock was taken, SIGKILLs the swap's shell and every subshell between it and the wrapper:
the node stops exactly there, as on a power cut or an OOM kill, with no trap run.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from deploy_support import assert_whole, make_node, sha

from vgpu_patch.deploy.request import SwapHooks
from vgpu_patch.deploy.swap import SwapResult, deploy_file, node_status, rollback
from vgpu_patch.report.errors import VgpuPatchError
from vgpu_patch.transport.local import LocalTransport

DIR = "/usr/local/vgpu"
TOOLS = ("head", "cp", "mv", "sha256sum", "stat", "od", "sync", "chmod", "chown", "chcon", "date", "id", "find",
         "rm", "rmdir", "cmp", "grep", "sort", "tail", "tr", "mkdir", "sed", "cat", "dirname", "readlink")

# $KP/armed exists from the lock on; $KP/log gets one line per command run since; the KP_AT-th kills
_WRAPPER = r"""#!/bin/sh
name=${0##*/}
PATH=$KP_PATH
"$name" "$@"
rc=$?
if [ -e "$KP/armed" ]; then
  exec 8>>"$KP/log"
  flock 8
  n=$(($(wc -l < "$KP/log") + 1))
  printf '%s %s\n' "$n" "$name" >&8
  if [ "$n" -eq "$KP_AT" ]; then
    pids=""; p=$PPID
    while [ "$p" -gt 1 ] && [ "$p" != "$KP_TOP" ]; do
      pids="$pids $p"
      p=$(sed -n 's/^PPid:[[:space:]]*//p' "/proc/$p/status")
    done
    # shellcheck disable=SC2086
    kill -9 $pids
  fi
fi
exit "$rc"
"""


@pytest.fixture()
def killer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Returns arm(k): the next swap is SIGKILLed after its k-th command under the lock (0: never)."""
    bindir, kp = tmp_path / "kp-bin", tmp_path / "kp"
    bindir.mkdir()
    kp.mkdir()
    for tool in TOOLS:
        if shutil.which(tool):
            (bindir / tool).write_text(_WRAPPER)
            (bindir / tool).chmod(0o755)
    monkeypatch.setenv("KP_PATH", os.environ["PATH"])
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("KP", str(kp))
    monkeypatch.setenv("KP_TOP", str(os.getpid()))

    def arm(k: int) -> SwapHooks:
        for f in ("armed", "log"):
            (kp / f).unlink(missing_ok=True)
        (kp / "log").touch()
        os.environ["KP_AT"] = str(k)
        return SwapHooks(in_lock=f": > {kp}/armed")

    def commands() -> int:
        return len((kp / "log").read_text().splitlines())

    arm.commands = commands  # type: ignore[attr-defined]
    yield arm
    os.environ.pop("KP_AT", None)


def _history(d: Path) -> list[dict]:
    p = d / ".vgpu-patch" / "history.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def _points(t: LocalTransport, arm, run) -> int:  # type: ignore[no-untyped-def]
    """How many commands an unkilled run of `run` makes under the lock."""
    run(t, arm(0))
    return int(arm.commands())


def _killed_at_each_point(tmp_path: Path, libs, arm, fresh, run):  # type: ignore[no-untyped-def]
    """For each command k of `run` under the lock: a fresh node (fresh(root) -> its directory), `run` killed
    after its k-th command; checks what holds after any kill (the run failed, the node holds v1 or v2 whole,
    the history says which) and yields (k, transport, node directory, the live file)."""
    def node(name: str) -> tuple[LocalTransport, Path]:
        root = tmp_path / name
        d = fresh(root)
        return LocalTransport(root), d

    n = _points(node("count")[0], arm, run)
    assert n >= 8, "the wrappers saw too few commands: is the PATH seam broken?"
    for k in range(1, n + 1):
        t, d = node(f"k{k}")
        with pytest.raises(VgpuPatchError):
            run(t, arm(k))
        arm(0)
        live = assert_whole(d / "libvgpu.so", libs["v1"], libs["v2"])
        status = node_status(t, DIR)
        assert not status.replaced_outside, f"kill after command {k}: the history does not say what is live"
        yield k, t, d, live


def test_deploy_killed_after_any_command(tmp_path: Path, libs, killer) -> None:
    def v2(t: LocalTransport, hooks: SwapHooks) -> SwapResult:
        return deploy_file(t, libs["v2"], DIR, operator="kp", hooks=hooks)

    def fresh(root: Path) -> Path:
        d = make_node(root, libs["vendor"])
        deploy_file(LocalTransport(root), libs["v1"], DIR, operator="kp")
        return d

    for k, t, d, live in _killed_at_each_point(tmp_path, libs, killer, fresh, v2):
        v2(t, killer(0))  # the rerun: a no-op when the swap went through, else the swap
        assert_whole(d / "libvgpu.so", libs["v2"])
        r = rollback(t, DIR, operator="kp")
        assert r.to_sha256 == sha(libs["v1"]), (
            f"kill after command {k} ({live.name} was live): rollback went to {r.to_sha256[:12]}, not v1; "
            f"history {_history(d)}")
        assert_whole(d / "libvgpu.so", libs["v1"])
        # on disk too: the rollback put a killed swap's pending record into the history first
        assert not (d / ".vgpu-patch" / "pending.json").exists()
        assert rollback(t, DIR, operator="kp").to_sha256 == sha(libs["vendor"]), f"history {_history(d)}"


def test_the_rollback_stack_reads_a_pending_record(tmp_path: Path) -> None:
    """The node program's rollback stack (node.sh `rollback_stack`, which the CLI, the agent and the Ansible role
    all run) settles pending.json as a swap's record does."""
    import subprocess

    from vgpu_patch.deploy import facts as F

    def line(frm: str | None, to: str) -> str:
        return json.dumps({"action": "deploy", "from_sha256": frm, "to_sha256": to}) + "\n"

    state = tmp_path / ".vgpu-patch"
    state.mkdir()
    (state / "history.jsonl").write_text(line(None, "a" * 64) + line("a" * 64, "b" * 64))
    (state / "pending.json").write_text(line("b" * 64, "c" * 64))

    def stack(live: str) -> list[str]:
        sh = F.node_program() + f"\nS='{state}'; cur='{live}'; rollback_stack; echo $STACK\n"
        return subprocess.run(["sh", "-c", sh], capture_output=True, text=True, check=True).stdout.split()

    assert stack("c" * 64) == ["a" * 64, "b" * 64]  # the pending swap happened: back to what it replaced
    assert stack("b" * 64) == ["a" * 64]  # it never did
    (state / "history.jsonl").write_text(line(None, "a" * 64) + line("a" * 64, "b" * 64) + line("b" * 64, "c" * 64))
    assert stack("c" * 64) == ["a" * 64, "b" * 64]  # recorded, pending.json not yet removed: one swap, not two


def test_rollback_killed_after_any_command(tmp_path: Path, libs, killer) -> None:
    def back(t: LocalTransport, hooks: SwapHooks) -> SwapResult:
        return rollback(t, DIR, operator="kp", hooks=hooks)

    def fresh(root: Path) -> Path:
        d = make_node(root, libs["vendor"])
        t = LocalTransport(root)
        deploy_file(t, libs["v1"], DIR, operator="kp")
        deploy_file(t, libs["v2"], DIR, operator="kp")
        return d

    for k, t, d, live in _killed_at_each_point(tmp_path, libs, killer, fresh, back):
        # one more rollback goes one further back from what is live: v2 -> v1, v1 -> the vendor's
        want = libs["vendor"] if live == libs["v1"] else libs["v1"]
        r = back(t, killer(0))
        assert r.to_sha256 == sha(want), f"kill after command {k}: history {_history(d)}"
