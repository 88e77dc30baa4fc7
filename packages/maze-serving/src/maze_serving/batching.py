"""One ``generate`` call for several requests, each keeping its own sampling, seed and limits.

Hugging Face ``generate`` takes one sampling configuration per call and draws from the global
RNG, so a batch runs as greedy decoding and :class:`_RowSampler`, a logits processor, picks
each sampled row's token itself: temperature and top-p through the same warpers ``generate``
uses, then ``torch.multinomial`` with the request's own ``torch.Generator`` seeded by its seed.
A request therefore draws what ``generate(do_sample=True)`` under ``torch.manual_seed(seed)``
draws, alone or in a batch. :class:`_RowStop` ends each row at its own ``max_tokens``, on EOS
or when it is cancelled, and hands a finished row's result over at once (unless it asked for
log-probs, which need the logits ``generate`` returns at the end); :class:`_RowSink` streams
each row's tokens to its own callback.

Rows of different lengths are left-padded. The model's float results then depend on the batch
shape (BLAS picks kernels by row count), at the level of float rounding: log-probs agree to
~1e-6 and a token differs only where two candidates tie to that precision.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.streamers import BaseStreamer

from maze_policy.chat import Trajectory
from maze_policy.policy import Policy
from maze_policy.sampling import SamplingParams


@dataclass(eq=False, slots=True)
class Row:
    """One request of a batch: its prompt, sampling, seed, limits and callbacks."""

    traj: Trajectory
    params: SamplingParams
    seed: int
    min_new_tokens: int
    logprobs: bool
    cancel: threading.Event
    on_token: Callable[[int], None] | None = None
    on_finish: Callable[[RowResult], None] | None = None
    """Called with the result as soon as the row finishes, before the rest of its batch, when
    the row needs no log-probs (those come from logits ``generate`` returns only at the end)."""
    length: int | None = None
    """Tokens generated when the row finished (its EOS included); ``None`` while it runs."""
    reported: bool = field(default=False, init=False)
    generator: torch.Generator | None = field(default=None, init=False)
    warpers: list[LogitsProcessor] = field(default_factory=list[LogitsProcessor], init=False)

    def __post_init__(self) -> None:
        if self.params.greedy:
            return
        self.generator = torch.Generator().manual_seed(self.seed)
        # The warpers generate(do_sample=True) adds for these values, in its order.
        if self.params.temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(self.params.temperature))
        if self.params.top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=self.params.top_p, min_tokens_to_keep=1))


@dataclass(frozen=True, slots=True)
class RowResult:
    """What one row generated: ids before EOS, their log-probs if asked, why it stopped."""

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str
    """``"stop"`` (EOS), ``"length"`` (``max_tokens``) or ``"cancelled"``."""


class _RowSampler(LogitsProcessor):
    """Per row: mask EOS below ``min_new_tokens``; for sampled rows, draw the token."""

    def __init__(self, rows: Sequence[Row], width: int, eos_ids: Sequence[int]) -> None:
        self.rows = rows
        self.width = width
        self.eos = torch.tensor(list(eos_ids), dtype=torch.long)
        self.any_sampled = any(r.generator is not None for r in rows)
        self.max_min_new = max(r.min_new_tokens for r in rows)

    def __call__(  # pyright: ignore[reportIncompatibleMethodOverride]
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor
    ) -> torch.FloatTensor:
        step = int(input_ids.shape[1]) - self.width
        if not self.any_sampled and step >= self.max_min_new:
            return scores
        # A copy: ``scores`` may be the raw logits generate() keeps for ``output_logits``.
        out = cast(torch.Tensor, scores).clone()
        for r, row in enumerate(self.rows):
            if row.length is not None:
                continue
            if step < row.min_new_tokens:
                out[r, self.eos] = float("-inf")
            if row.generator is None:
                continue  # greedy: generate() takes the argmax
            s = out[r : r + 1]
            ids = cast(torch.LongTensor, input_ids[r : r + 1])
            for warp in row.warpers:
                s = warp(ids, cast(torch.FloatTensor, s))
            probs = torch.softmax(s, dim=-1)
            tok = int(torch.multinomial(probs, num_samples=1, generator=row.generator))
            out[r] = float("-inf")
            out[r, tok] = 0.0
        return cast(torch.FloatTensor, out)


def _result(
    row: Row,
    generated: list[int],
    eos: set[int],
    r: int,
    *,
    logits: Sequence[torch.Tensor] | None = None,
    suppress_ids: Sequence[int] = (),
) -> RowResult:
    """Row ``r``'s result from its generated ids (and the batch's raw logits, for log-probs)."""
    ids: list[int] = []
    finish = "length"
    for tok in generated:
        if tok in eos:
            finish = "stop"
            break
        ids.append(int(tok))
    if row.cancel.is_set():
        finish = "cancelled"
    lps: list[float] | None = None
    if row.logprobs and logits is not None:
        t = row.params.logprob_temperature
        suppress = torch.tensor(list(suppress_ids), dtype=torch.long)
        lps = []
        for step, tok in enumerate(ids):
            x = logits[step][r].float() / t
            x = x.index_fill(-1, suppress, float("-inf"))
            lps.append(float(torch.log_softmax(x, -1)[tok]))
    return RowResult(ids, lps, finish)


class _RowStop(StoppingCriteria):
    """Finishes each row on EOS, at its own ``max_tokens`` or when cancelled; records its length.

    A finished row without log-probs is reported to its ``on_finish`` right away.
    """

    def __init__(self, rows: Sequence[Row], width: int, eos_ids: Sequence[int]) -> None:
        self.rows = rows
        self.width = width
        self.eos = set(eos_ids)

    def __call__(  # pyright: ignore[reportIncompatibleMethodOverride]
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any
    ) -> torch.BoolTensor:
        n = int(input_ids.shape[1]) - self.width
        last = cast(list[int], input_ids[:, -1].tolist())
        for r, (row, tok) in enumerate(zip(self.rows, last, strict=True)):
            if row.length is None and (
                tok in self.eos or n >= row.params.max_new_tokens or row.cancel.is_set()
            ):
                row.length = n
                if row.on_finish is not None and not row.logprobs:
                    generated = cast(list[int], input_ids[r, self.width :].tolist())
                    row.on_finish(_result(row, generated, self.eos, r))
                    row.reported = True
        done = [row.length is not None for row in self.rows]
        return cast(torch.BoolTensor, torch.tensor(done, dtype=torch.bool))


class _RowSink(BaseStreamer):
    """Hands each running row's new token to its ``on_token`` (the first ``put`` is the prompt)."""

    def __init__(self, rows: Sequence[Row]) -> None:
        self.rows = rows
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        toks = cast(list[int], cast(torch.Tensor, value).reshape(-1).tolist())
        for row, tok in zip(self.rows, toks, strict=True):
            # Finished rows get padding from here on; put() runs before the stop check, so a
            # row's EOS is still handed over (the detokenizer drops it).
            if row.on_token is None or row.length is not None:
                continue
            try:
                row.on_token(int(tok))
            except RuntimeError:  # the client's event loop is gone: stop this row only
                row.cancel.set()

    def end(self) -> None:
        return None


def generate_rows(policy: Policy, model: Any, rows: Sequence[Row]) -> list[RowResult | None]:
    """Generate every row in one ``model.generate`` call; see the module docstring.

    Args:
        policy: Gives the collation, EOS, padding and suppressed ids.
        model: The model to call (the base, or the peft model with the rows' adapter active).
        rows: The requests, all for that model.

    Returns:
        One result per row, in order; ``None`` for a row already handed to its ``on_finish``.
    """
    batch = policy.collate([r.traj for r in rows], padding_side="left")
    width = int(batch.input_ids.shape[1])
    eos = policy.eos_ids
    kwargs: dict[str, Any] = {
        **batch.model_inputs(),
        "max_new_tokens": max(r.params.max_new_tokens for r in rows),
        "do_sample": False,
        "temperature": None,
        "top_p": None,
        "top_k": None,
        "eos_token_id": eos,
        "pad_token_id": policy.encoder.pad_token_id,
        "suppress_tokens": policy.suppress_ids,
        "output_logits": any(r.logprobs for r in rows),
        "return_dict_in_generate": True,
        "logits_processor": LogitsProcessorList([_RowSampler(rows, width, eos)]),
        "stopping_criteria": StoppingCriteriaList([_RowStop(rows, width, eos)]),
    }
    if any(r.on_token is not None for r in rows):
        kwargs["streamer"] = _RowSink(rows)
    with torch.no_grad():
        out = model.generate(**kwargs)
    seqs = cast(torch.Tensor, out.sequences)[:, width:]
    logits = cast(tuple[torch.Tensor, ...] | None, getattr(out, "logits", None))
    results: list[RowResult | None] = []
    for r, row in enumerate(rows):
        if row.reported:
            results.append(None)
            continue
        n = row.length if row.length is not None else int(seqs.shape[1])
        generated = cast(list[int], seqs[r, :n].tolist())
        results.append(
            _result(row, generated, set(eos), r, logits=logits, suppress_ids=policy.suppress_ids)
        )
    return results


__all__ = ["Row", "RowResult", "generate_rows"]
