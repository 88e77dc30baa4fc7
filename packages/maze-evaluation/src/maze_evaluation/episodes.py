"""What backends share: the episode jobs they play and what they report back."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from maze_evaluation.records import Identity
from maze_policy.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class Job:
    """One episode to play: a dataset row (maze-env's export format), its sample index and seed."""

    row: Mapping[str, Any]
    sample: int
    seed: int

    @property
    def key(self) -> tuple[int, int]:
        return (int(self.row["seed"]), self.sample)


@dataclass(frozen=True, slots=True)
class Played:
    """A finished episode as the env saw it."""

    job: Job
    replies: list[str]
    reward: float
    elapsed_s: float


class Backend(Protocol):
    """Plays jobs through the ``maze`` env and reports each one as it finishes."""

    @property
    def identity(self) -> Identity: ...

    def play(
        self, jobs: Sequence[Job], sampling: SamplingParams, on_done: Callable[[Played], None]
    ) -> None: ...
