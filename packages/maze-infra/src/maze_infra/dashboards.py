"""Placeholder: filled in by this package's dashboards work."""

from __future__ import annotations

import argparse
from typing import Any


def register(groups: Any) -> None:
    """Add this module's command group to ``maze-infra``."""
    del groups


_ = argparse
