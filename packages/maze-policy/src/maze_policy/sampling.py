"""Sampling settings shared by training rollouts, evaluation and serving (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How replies are sampled: temperature/top-p sampling, or greedy argmax decoding."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    greedy: bool = False

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(
                f"temperature must be > 0 (use greedy=True for argmax), got {self.temperature}"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def logprob_temperature(self) -> float:
        """Temperature of the recorded log-probs: 1 for greedy decoding."""
        return 1.0 if self.greedy else self.temperature
