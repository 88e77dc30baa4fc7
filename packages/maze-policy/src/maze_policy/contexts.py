"""What each turn of an episode is answered from (torch-free, env-free).

Its own module so that a server can check ``--context`` before it binds its port without
importing the episode loop (which pulls in maze-env and its renderer).
"""

from __future__ import annotations

CONTEXTS = ("full", "latest", "recent")
"""What each turn is answered from: the whole conversation; the system prompt and the latest
user turn; or those with the previous reply between them (see ``maze_policy.rollout``)."""

PER_TURN_CONTEXTS = ("latest", "recent")
"""The contexts that play each turn as its own token sequence."""


def check_context(context: str) -> str:
    """``context`` if it is one of :data:`CONTEXTS`; a ValueError naming them otherwise."""
    if context not in CONTEXTS:
        raise ValueError(f"context must be one of {', '.join(CONTEXTS)}, got {context!r}")
    return context
