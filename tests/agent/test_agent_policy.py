"""The agent's decision as a table: (live file, newest record, starting?, yielded?) -> (action, copy-back?)."""
from __future__ import annotations

import pytest

from vgpu_patch.agent.policy import Decision, decide

OURS, VENDOR, OTHER = "a" * 64, "b" * 64, "c" * 64


def rec(to: str, action: str = "deploy") -> dict:
    return {"action": action, "to_sha256": to, "from_sha256": VENDOR, "tool": "agent"}


TABLE = [
    # live,  newest record,         startup, yielded -> action, copy_back
    (OURS, None, True, False, "ok", False),
    (OURS, rec(OURS), False, True, "ok", False),  # our library is back: the yield ends
    (VENDOR, None, True, False, "deploy", False),  # a first install
    (None, None, True, False, "deploy", False),  # a fresh host
    (None, rec(OURS), False, False, "reapply", False),  # the file was deleted: nothing live to call a copy-back
    (VENDOR, rec(OURS), False, False, "reapply", True),  # the plugin's copy-back while running
    (VENDOR, rec(OURS), True, False, "reapply", True),  # ... while the agent was down
    (VENDOR, rec(VENDOR, "rollback"), False, False, "yield", False),  # an operator's rollback is respected
    (VENDOR, rec(VENDOR, "rollback"), True, False, "deploy", False),  # a restart enforces again
    (OTHER, rec(OTHER), False, False, "yield", False),  # another tool's recorded deploy
    (OTHER, rec(VENDOR, "rollback"), False, True, "yielded", True),  # yielded stays yielded until restart
    (OTHER, rec(VENDOR), True, False, "deploy", True),  # replaced outside, and not our library before
    (VENDOR, {"action": "deploy"}, False, False, "deploy", False),  # a record without to_sha256 says nothing
]


@pytest.mark.parametrize(("live", "last", "startup", "yielded", "action", "copy_back"), TABLE)
def test_decide(live: str | None, last: dict | None, startup: bool, yielded: bool, action: str,
                copy_back: bool) -> None:
    assert decide(live, OURS, last, startup=startup, yielded=yielded) == Decision(action, copy_back)
