"""Chaos testing: make the trainer die at a named point, as a lost node would end it."""

from __future__ import annotations

import os
import signal

FAULT_ENV = "MAZE_ENGINE_FAULT"
"""``PHASE@STEP`` (phase ``rollout``, ``update`` or ``checkpoint``): SIGKILL this process at that
point of that global step."""


def fault(phase: str, step: int) -> None:
    """SIGKILL this process if :data:`FAULT_ENV` names this phase and step."""
    spec = os.environ.get(FAULT_ENV)
    if spec and spec == f"{phase}@{step}":
        os.kill(os.getpid(), signal.SIGKILL)
