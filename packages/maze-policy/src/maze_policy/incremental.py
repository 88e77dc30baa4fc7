"""Turn-by-turn sampling that keeps each conversation's key/value cache between turns.

``Policy.generate`` re-reads a whole conversation on every call: at turn ``t`` of a maze
episode that is ``t`` images and all the text between them, so an episode costs time quadratic
in its turns. :class:`IncrementalGenerator` serves the same calls for one set of conversations
(the episodes of a rollout) and keeps their key/value cache, so each turn reads only what was
appended since the last one: the feedback, the new image and the generation prompt.

Conversations sit in one batch cache, each row holding its own tokens in order; what a row did
not fill (a shorter turn, a reply that ended early) is masked out for good. Positions are the
model's own multimodal rotary positions of each whole conversation, so every token sees the
positions a full pass would give it. Replies are sampled from the policy distribution that
``Policy.generate`` and :func:`~maze_policy.policy.sequence_logprobs` use (temperature,
suppressed ids; ``top_p`` truncates the sampling only), and their log-probs are recorded
from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch

from maze_policy.chat import Trajectory
from maze_policy.policy import Generation, Policy, _policy_logprobs, _unwrap  # pyright: ignore[reportPrivateUsage]
from maze_policy.sampling import SamplingParams


def _top_p_mask(logprobs: torch.Tensor, top_p: float) -> torch.Tensor:
    """True where a token survives nucleus truncation (the likeliest always does)."""
    probs = logprobs.exp()
    ordered, order = probs.sort(dim=-1, descending=True)
    # Keep a token if the mass of the tokens before it is below top_p.
    before = ordered.cumsum(-1) - ordered
    keep_sorted = before < top_p
    keep_sorted[..., 0] = True
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


class IncrementalGenerator:
    """``Policy.generate`` for conversations that grow turn by turn; see the module docstring.

    Call :meth:`generate` with the conversations still going, each extended only at its end
    since the last call (as a rollout extends them). A conversation it has not seen, or one
    changed elsewhere than at its end, starts the cache over for the whole batch.
    """

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        base = _unwrap(policy.model)
        inner = getattr(base, "model", None)
        if inner is None or not callable(getattr(inner, "get_rope_index", None)):
            raise TypeError(f"{type(base).__name__} has no multimodal rotary positions to keep")
        self._inner: Any = inner
        self._merge = int(policy.processor.image_processor.merge_size)
        self._reset()

    def _reset(self, rows: Sequence[Trajectory] = ()) -> None:
        """An empty cache for the conversations ``rows``."""
        from transformers import DynamicCache

        n = len(rows)
        self._cache: Any = DynamicCache()
        self._rows: list[Trajectory] = list(rows)
        self._fed: list[list[int]] = [[] for _ in range(n)]
        """Each row's conversation tokens already in the cache, in order."""
        self._images: list[int] = [0] * n
        """Images of each row's conversation already in the cache."""
        self._next_pos: list[int] = [0] * n
        """The rotary position of each row's next token."""
        self._mask = torch.zeros((n, 0), dtype=torch.long)

    def _select(self, trajectories: Sequence[Trajectory]) -> bool:
        """Keep only the rows of ``trajectories``, in their order; False if one is not cached."""
        index = {id(t): i for i, t in enumerate(self._rows)}
        rows = [index.get(id(t)) for t in trajectories]
        if not self._rows or any(r is None for r in rows):
            return False
        keep = [cast(int, r) for r in rows]
        for t, r in zip(trajectories, keep, strict=True):
            fed = self._fed[r]
            if len(t) <= len(fed) or t.input_ids[: len(fed)] != fed:
                return False
        if keep != list(range(len(self._rows))):
            self._cache.batch_select_indices(torch.tensor(keep))
            self._mask = self._mask[keep]
            self._rows = [self._rows[r] for r in keep]
            self._fed = [self._fed[r] for r in keep]
            self._images = [self._images[r] for r in keep]
            self._next_pos = [self._next_pos[r] for r in keep]
        return True

    def _positions(self, traj: Trajectory) -> torch.Tensor:
        """The model's rotary positions ``[3, L]`` of the whole conversation."""
        ids = torch.tensor([traj.input_ids])
        mm = (ids == self.policy.encoder.image_token_id).long()
        grid = torch.stack(traj.image_grid_thw) if traj.image_grid_thw else None
        pos, _delta = self._inner.get_rope_index(ids, mm, image_grid_thw=grid)
        return cast(torch.Tensor, pos)[:, 0]

    def _forward(
        self,
        ids: torch.Tensor,
        new_mask: torch.Tensor,
        positions: torch.Tensor,
        pixel_values: list[torch.Tensor],
        grids: list[torch.Tensor],
    ) -> torch.Tensor:
        """Feed ``ids`` ``[B, n]`` after the cache; logits ``[B, n, V]``."""
        self._mask = torch.cat([self._mask, new_mask], dim=1)
        inputs: dict[str, Any] = {
            "input_ids": ids,
            "attention_mask": self._mask,
            "position_ids": positions,
            "past_key_values": self._cache,
            "use_cache": True,
        }
        if pixel_values:
            inputs["pixel_values"] = torch.cat(pixel_values)
            inputs["image_grid_thw"] = torch.stack(grids)
            inputs["mm_token_type_ids"] = (ids == self.policy.encoder.image_token_id).long()
        out = cast(Any, self.policy.model)(**inputs)
        self._cache = out.past_key_values
        return cast(torch.Tensor, out.logits)

    def _prefill(self, trajectories: Sequence[Trajectory]) -> torch.Tensor:
        """Feed each row what it gained since the last call; the logits of its last token."""
        enc = self.policy.encoder
        chunks: list[list[int]] = []
        pixel_values: list[torch.Tensor] = []
        grids: list[torch.Tensor] = []
        pos_rows: list[torch.Tensor] = []
        for b, traj in enumerate(trajectories):
            start = len(self._fed[b])
            chunks.append(traj.input_ids[start:])
            pixel_values.extend(traj.pixel_values[self._images[b] :])
            grids.extend(traj.image_grid_thw[self._images[b] :])
            pos_rows.append(self._positions(traj)[:, start:])
        width = max(len(c) for c in chunks)
        ids = torch.full((len(chunks), width), enc.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(chunks), width), dtype=torch.long)
        positions = torch.zeros((3, len(chunks), width), dtype=torch.long)
        for b, (chunk, pos) in enumerate(zip(chunks, pos_rows, strict=True)):
            ids[b, : len(chunk)] = torch.tensor(chunk, dtype=torch.long)
            mask[b, : len(chunk)] = 1
            positions[:, b, : len(chunk)] = pos
            self._fed[b].extend(chunk)
            self._images[b] = len(trajectories[b].pixel_values)
            self._next_pos[b] = int(pos.max()) + 1
        logits = self._forward(ids, mask, positions, pixel_values, grids)
        last = torch.tensor([len(c) - 1 for c in chunks])
        return logits[torch.arange(len(chunks)), last]

    def _sample(
        self, logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        suppress = torch.tensor(self.policy.suppress_ids, dtype=torch.long)
        recorded = _policy_logprobs(logits, suppress, params.logprob_temperature)
        if params.greedy:
            tokens = recorded.argmax(-1)
        else:
            draw = recorded
            if params.top_p < 1.0:
                keep = _top_p_mask(recorded, params.top_p)
                draw = recorded.masked_fill(~keep, float("-inf"))
            tokens = torch.multinomial(draw.exp(), 1, generator=gen).squeeze(-1)
        return tokens, recorded.gather(-1, tokens[:, None]).squeeze(-1)

    @torch.no_grad()
    def generate(
        self,
        trajectories: Sequence[Trajectory],
        params: SamplingParams,
        *,
        seed: int | None = None,
    ) -> list[Generation]:
        """Sample one reply per trajectory; the same contract as ``Policy.generate``."""
        if not trajectories:
            return []
        if not self._select(trajectories):
            self._reset(trajectories)
        gen = None
        if seed is not None and not params.greedy:
            gen = torch.Generator().manual_seed(seed)
        model = self.policy.model
        was_training = model.training
        model.eval()
        try:
            logits = self._prefill(trajectories)
            n = len(trajectories)
            eos = torch.tensor(self.policy.eos_ids)
            out_ids: list[list[int]] = [[] for _ in range(n)]
            out_lps: list[list[float]] = [[] for _ in range(n)]
            done = torch.zeros(n, dtype=torch.bool)
            for step in range(params.max_new_tokens):
                tokens, lps = self._sample(logits, params, gen)
                for b in range(n):
                    if not done[b]:
                        out_ids[b].append(int(tokens[b]))
                        out_lps[b].append(float(lps[b]))
                done = done | torch.isin(tokens, eos)
                if bool(done.all()) or step + 1 == params.max_new_tokens:
                    break
                # Every unfinished row feeds its token; finished rows feed a masked pad.
                feed = torch.where(done, self.policy.encoder.pad_token_id, tokens)[:, None]
                live = (~done).long()[:, None]
                positions = torch.tensor(self._next_pos).view(1, n, 1).expand(3, n, 1)
                logits = self._forward(feed, live, positions, [], [])[:, -1]
                for b in range(n):
                    if not done[b]:
                        self._fed[b].append(int(tokens[b]))
                        self._next_pos[b] += 1
        finally:
            model.train(was_training)
        return [
            Generation(ids, lps, bool(ids) and ids[-1] in self.policy.eos_ids)
            for ids, lps in zip(out_ids, out_lps, strict=True)
        ]
