"""Reward specs: small frozen weightings of three episode terms, with a registry by name.

An episode's reward is ``task * solved + format * tag_fraction + efficiency * efficiency_credit``:

* ``solved``: 1 if the episode ended with ``stop`` on the goal (VisGym's task reward);
* ``tag_fraction``: fraction of turns holding every tag in ``format_tags`` non-empty (VisGym's
  SFT recipe uses ``<observation>``, ``<justification>``, ``<action>``);
* ``efficiency_credit``: ``optimal_moves / turns spent before stop`` when solved, else 0. Bumps
  and unparseable turns count as spent, so the credit is 1 only for a perfect run.

Specs compose by addition and scaling (``SPECS["task"] * 0.5 + SPECS["efficiency"] * 0.5``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, cast

from maze_verifier.errors import MazeVerifierError
from maze_verifier.tags import SFT_TAGS


class RewardSpecError(MazeVerifierError, ValueError):
    """A reward spec name or mapping that cannot be used."""


@dataclass(frozen=True, slots=True)
class RewardSpec:
    """Weights of the three reward terms (see the module docs) and the tags the format term checks.

    Raises:
        RewardSpecError: A weight is not a finite number, or a tag is empty or has brackets.
    """

    name: str
    task: float = 1.0
    format: float = 0.0
    efficiency: float = 0.0
    format_tags: tuple[str, ...] = SFT_TAGS

    def __post_init__(self) -> None:
        for field_name in ("task", "format", "efficiency"):
            value = getattr(self, field_name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise RewardSpecError(
                    f"reward spec {self.name!r}: {field_name} must be a finite number, got {value!r}"
                )
        tags = cast(tuple[object, ...], self.format_tags)  # runtime config may hold anything
        if not tags or not all(isinstance(t, str) and t.strip() for t in tags):
            raise RewardSpecError(
                f"reward spec {self.name!r}: format_tags must be non-empty strings"
            )
        if any(c in t for t in self.format_tags for c in "<>/"):
            raise RewardSpecError(
                f"reward spec {self.name!r}: give tag names without brackets, e.g. 'action'"
            )

    @property
    def max_reward(self) -> float:
        return max(self.task, 0.0) + max(self.format, 0.0) + max(self.efficiency, 0.0)

    def reward(self, *, solved: bool, tag_fraction: float, efficiency: float) -> float:
        return self.task * float(solved) + self.format * tag_fraction + self.efficiency * efficiency

    def __add__(self, other: RewardSpec) -> RewardSpec:
        if self.format_tags != other.format_tags and self.format and other.format:
            raise RewardSpecError(
                f"cannot add specs {self.name!r} and {other.name!r}: they check different tags"
            )
        tags = self.format_tags if self.format else other.format_tags
        return RewardSpec(
            name=f"{self.name}+{other.name}",
            task=self.task + other.task,
            format=self.format + other.format,
            efficiency=self.efficiency + other.efficiency,
            format_tags=tags,
        )

    def __mul__(self, k: float) -> RewardSpec:
        return replace(
            self,
            name=f"{k:g}*{self.name}",
            task=self.task * k,
            format=self.format * k,
            efficiency=self.efficiency * k,
        )

    __rmul__ = __mul__

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "task": self.task,
            "format": self.format,
            "efficiency": self.efficiency,
            "format_tags": list(self.format_tags),
        }


SPECS: dict[str, RewardSpec] = {}


def register_spec(spec: RewardSpec, *, overwrite: bool = False) -> RewardSpec:
    """Add ``spec`` to the registry under its name. Re-registering an equal spec is a no-op."""
    existing = SPECS.get(spec.name)
    if existing is not None and existing != spec and not overwrite:
        raise RewardSpecError(f"reward spec {spec.name!r} is already registered with other weights")
    SPECS[spec.name] = spec
    return spec


TASK = register_spec(RewardSpec("task"))
"""1 if solved, else 0: VisGym's environment reward."""
VISGYM_SFT = register_spec(RewardSpec("visgym_sft", task=0.8, format=0.2))
"""VisGym's SFT recipe: 0.8 task + 0.2 x fraction of turns with all three tags."""
EFFICIENCY = register_spec(RewardSpec("efficiency", task=0.8, efficiency=0.2))
"""Task reward plus credit for short solutions: 0.8 task + 0.2 x optimal/spent."""
VISGYM_SFT_EFFICIENCY = register_spec(
    RewardSpec("visgym_sft_efficiency", task=0.7, format=0.15, efficiency=0.15)
)


def get_spec(spec: str | RewardSpec | Mapping[str, Any]) -> RewardSpec:
    """A spec by registered name, as is, or from a mapping of weights.

    A mapping may name a base spec and override weights:
    ``{"base": "visgym_sft", "efficiency": 0.1}`` or give them all: ``{"task": 1, "format": 0.5}``.
    """
    if isinstance(spec, RewardSpec):
        return spec
    if isinstance(spec, str):
        found = SPECS.get(spec.strip())
        if found is None:
            raise RewardSpecError(
                f"unknown reward spec {spec!r}; registered: {', '.join(sorted(SPECS))}"
            )
        return found
    if isinstance(spec, Mapping):  # pyright: ignore[reportUnnecessaryIsInstance] - runtime config values
        known = {"base", "name", "task", "format", "efficiency", "format_tags"}
        keys = {str(k) for k in spec}
        unknown = keys - known
        if unknown:
            raise RewardSpecError(
                f"unknown reward spec keys {sorted(unknown)}; allowed: {sorted(known)}"
            )
        base = get_spec(str(spec["base"])) if "base" in spec else RewardSpec("custom", task=0.0)
        tags = spec.get("format_tags", base.format_tags)
        if isinstance(tags, str) or not isinstance(tags, list | tuple):
            raise RewardSpecError(f"reward spec format_tags must be a list of names, got {tags!r}")
        try:
            return RewardSpec(
                name=str(spec.get("name", base.name if "base" in spec else "custom")),
                task=float(spec.get("task", base.task)),
                format=float(spec.get("format", base.format)),
                efficiency=float(spec.get("efficiency", base.efficiency)),
                format_tags=tuple(str(t) for t in tags),  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
            )
        except (TypeError, ValueError) as e:
            if isinstance(e, RewardSpecError):
                raise
            raise RewardSpecError(f"bad reward spec mapping {dict(spec)!r}: {e}") from e
    raise RewardSpecError(
        f"reward spec must be a name, RewardSpec or mapping, got {type(spec).__name__}"
    )
