"""The agent's decision, facts in, action out: a pure function (the loop only gathers facts and applies it).

| the live file | the newest record | the agent | action |
|---|---|---|---|
| the image's library | any | any | ok (also ends a yield) |
| another file | any | yielded, running | yielded (stays so until restarted) |
| another file | set that file (an operator's deploy or rollback) | running | yield |
| another file, or none | set the image's library (then someone replaced it: copy-back) | any | reapply |
| another file, or none | none, or another file | starting | deploy |
A live file that differs from the newest record was replaced outside vgpu-patch: `copy_back`.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    action: str  # ok | yielded | yield | deploy | reapply
    copy_back: bool = False  # the live file is not what the newest record set: the plugin's copy-back?


def decide(live_sha256: str | None, want: str, last: dict | None, *, startup: bool, yielded: bool) -> Decision:
    """What to do about the live file (`live_sha256`, None when there is none), given the newest history record
    (`last`, None when nothing was recorded), whether the agent is starting and whether it has yielded."""
    if live_sha256 is not None and live_sha256 == want:
        return Decision("ok")
    recorded = last.get("to_sha256") if last else None
    copy_back = live_sha256 is not None and isinstance(recorded, str) and recorded != live_sha256
    if not startup and yielded:
        return Decision("yielded", copy_back)
    if not startup and live_sha256 is not None and recorded == live_sha256:
        return Decision("yield")
    return Decision("reapply" if recorded == want else "deploy", copy_back)
