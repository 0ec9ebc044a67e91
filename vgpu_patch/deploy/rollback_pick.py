"""The rollback stack, standalone: the CLI imports `rollback_stack`; the Ansible role ships this very file
(files/rollback_pick.py) and runs it on the node as `python3 -c "$program" HISTORY LIVE_SHA previous|vendor`,
printing the sha256 to restore (nothing when there is none). No imports from the package: it runs alone.
"""
import json
import os
import sys


def settle(history, pending, live):  # type: (list[dict], dict | None, str | None) -> list[dict]
    """The history with a swap killed between its rename and its record put back: each swap writes its line to
    pending.json before the rename and moves it into history.jsonl after. A pending line that is not the last
    history line (a kill before the move) counts as done when its file is live (`live`: its sha256 now)."""
    if pending is None or pending.get("to_sha256") != live or live is None or history[-1:] == [pending]:
        return history
    return [*history, pending]


def rollback_stack(history):  # type: (list[dict]) -> list[str]
    """The files a rollback can walk back through, oldest first: each swap pushes what it replaced, each
    rollback to a file on the stack pops back to below it (deploy v1, v2; rollback, rollback = v1, vendor)."""
    stack = []  # type: list[str]
    for e in history:
        frm, to = e.get("from_sha256"), e.get("to_sha256")
        if not isinstance(to, str):
            continue
        if e.get("action") == "rollback" and to in stack:
            del stack[len(stack) - 1 - stack[::-1].index(to):]
            continue
        if isinstance(frm, str) and frm != to and (not stack or stack[-1] != frm):
            stack.append(frm)
    return stack


def _lines(path):  # type: (str) -> list[dict]
    out = []
    try:
        with open(path, "rb") as f:
            for raw in f:
                try:
                    doc = json.loads(raw.decode("utf-8"))
                except ValueError:
                    continue  # a torn or undecodable line: skipped, as by the CLI
                if isinstance(doc, dict):
                    out.append(doc)
    except OSError:
        pass
    return out


def main():  # type: () -> None
    path, live, to = sys.argv[1:4]
    history = _lines(path)
    pending = _lines(os.path.join(os.path.dirname(path), "pending.json"))[:1]

    def whole(h):  # type: (str) -> bool
        # a backup that is not a whole library (kept by older versions) is never restored
        try:
            return os.path.getsize(os.path.join(os.path.dirname(path), "backups", h + ".so")) > 64
        except OSError:
            return True  # missing: the swap script's own check says so

    history = settle(history, pending[0] if pending else None, live or None)
    stack = [h for h in rollback_stack(history) if h != live and whole(h)]
    print((stack[0] if to == "vendor" else stack[-1]) if stack else "")


if __name__ == "__main__":
    main()
