"""An Ansible callback for the tests: a writer of the candidate's directory who renames another file into place
before each task of the role's candidate and swap steps starts (a task is the unit that reads a file).

VGPU_TEST_READ_SWAP is a JSON object: `path` (the candidate), `files` (name -> a file whose bytes to put there),
`plan` (the name to put before each such task, in order; past its end, `rest`) and `log` (a file where each
task's position and name is appended, to count them)."""
from __future__ import annotations

import json
import os
import shutil

from ansible.plugins.callback import CallbackBase

STEPS = ("/tasks/candidate.yml:", "/tasks/swap.yml:")


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "read_swap"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self.cfg = json.loads(os.environ.get("VGPU_TEST_READ_SWAP") or "{}")
        self.position = 0

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:  # Ansible calls it so
        where = task.get_path() or ""
        if not self.cfg or not any(step in where for step in STEPS):
            return
        plan = self.cfg.get("plan") or []
        name = plan[self.position] if self.position < len(plan) else self.cfg.get("rest")
        if name:
            tmp = self.cfg["path"] + ".swap-tmp"
            shutil.copyfile(self.cfg["files"][name], tmp)
            os.replace(tmp, self.cfg["path"])
        with open(self.cfg["log"], "a") as log:
            log.write(json.dumps([self.position, task.get_name(), name]) + "\n")
        self.position += 1
