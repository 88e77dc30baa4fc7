"""Seeds derived from named parts, so every sampling decision is reproducible on its own."""

from __future__ import annotations

import hashlib


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from its parts: rollouts are reproducible whatever ran before them.

    Args:
        *parts: Values that name the decision, e.g. ``(run_seed, "step", 3)``.

    Returns:
        A non-negative integer below 2**63.
    """
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
