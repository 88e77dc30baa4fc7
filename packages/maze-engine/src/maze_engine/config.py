"""The local engine's own settings: the ``local:`` section of a mazerl config file.

Everything else in the file is SkyRL's schema (``SkyRLTrainConfig``), read by both engines; only
what SkyRL has no key for lives here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


class LocalConfigError(ValueError):
    """A ``local.*`` key that is unknown or has a bad value; the message names the key."""


@dataclass(frozen=True)
class LocalConfig:
    rollout_workers: int = 2
    """Ray actors generating rollouts; 0 runs rollouts in the learner's process (no Ray)."""
    torch_threads: int = 1
    """Threads per process (learner and each worker). Fixed so runs repeat bit for bit."""
    train_preset: str = "5x5"
    """Maze spec of the training mazes (``easy``, ``hard``, ``ROWSxCOLS[:generator]``)."""
    train_size: int = 256
    eval_set: str = "tiny-64"
    """Fixed eval set (maze-env ``EVAL_SETS``) scored before and after training."""
    cell_px: int = 32
    """Pixels per grid square: 32 puts one square in one Qwen3-VL visual token."""
    slack: int = 2
    """Turns beyond optimal moves + stop in each training maze's budget."""
    reward_spec: str = "task"
    """maze-verifier reward spec for training rows (``task``, ``visgym_sft``, ``efficiency``)."""
    sft_steps: int = 600
    """Warm-start steps on oracle demonstrations when the base model is built here."""
    tiny_model: dict[str, Any] = field(default_factory=dict[str, Any])
    """Overrides of ``maze_engine.model.TinyVLMConfig`` for the built model."""
    prometheus_port: int | None = None
    """Serve metrics on 127.0.0.1:PORT (0 picks a free port); None disables."""
    tensorboard: bool = True
    progress: bool = True
    ckpt_s3_uri: str | None = None
    """Mirror each checkpoint to ``s3://bucket/prefix`` (boto3; honours AWS_ENDPOINT_URL)."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LocalConfig:
        names = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise LocalConfigError(
                f"unknown key local.{unknown[0]}; allowed: {', '.join(sorted(names))}"
            )
        out = cls(**data)
        out.validate()
        return out

    def validate(self) -> None:
        def bad(key: str, want: str) -> LocalConfigError:
            return LocalConfigError(f"local.{key} must be {want}, got {getattr(self, key)!r}")

        for key, lo in (
            ("rollout_workers", 0),
            ("torch_threads", 1),
            ("train_size", 1),
            ("cell_px", 4),
            ("slack", 0),
            ("sft_steps", 0),
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise bad(key, f"an int >= {lo}")
        if self.prometheus_port is not None and not 0 <= self.prometheus_port <= 65535:
            raise bad("prometheus_port", "a port number (0 = any free port) or null")
        from maze_env import EVAL_SETS, MazeSpec, MazeSpecError

        if self.eval_set not in EVAL_SETS:
            raise bad("eval_set", f"one of {', '.join(EVAL_SETS)}")
        try:
            MazeSpec.parse(self.train_preset)
        except MazeSpecError as exc:
            raise LocalConfigError(f"local.train_preset: {exc}") from exc
        from maze_verifier import SPECS

        if self.reward_spec not in SPECS:
            raise bad("reward_spec", f"one of {', '.join(sorted(SPECS))}")
