"""What backends share: episode jobs, sampling settings and the env that plays them."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from maze_evaluation.records import Identity

ENV_CLASS = "maze"


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from its parts (the same derivation as maze-engine's rollouts)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass(frozen=True, slots=True)
class Sampling:
    """Greedy by default; pass@k runs sample with ``temperature`` > 0 and a seed per episode."""

    greedy: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.greedy and self.temperature <= 0:
            raise ValueError(f"sampling needs temperature > 0, got {self.temperature}")


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
        self, jobs: Sequence[Job], sampling: Sampling, on_done: Callable[[Played], None]
    ) -> None: ...


def env_extras(row: Mapping[str, Any]) -> dict[str, Any]:
    """What SkyRL hands the env as ``extras``: every column but ``prompt`` and ``env_class``."""
    return {k: v for k, v in row.items() if k not in ("prompt", "env_class")}


def make_env(row: Mapping[str, Any]) -> Any:
    """The skyrl-gym ``maze`` env for ``row``, built exactly as SkyRL and maze-engine build it."""
    import skyrl_gym

    from maze_verifier import register_env

    env_class = str(row.get("env_class", ENV_CLASS))
    register_env(env_class)
    env: Any = skyrl_gym.make(env_class, env_config={}, extras=env_extras(row))  # pyright: ignore[reportUnknownVariableType]
    return env
