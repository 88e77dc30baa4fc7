"""Sampling with Hugging Face ``generate`` and recomputing per-token log-probabilities for GRPO.

The policy distribution is defined once and used by both sides: ``log_softmax(logits / T)``
over the vocabulary with *suppressed* tokens (vision placeholders and the embedding rows past
the tokenizer's vocabulary) removed. ``generate`` samples from it (``top_p`` truncates the
*sampling* only, as vLLM does; recorded log-probs are of the untruncated distribution), and
:func:`sequence_logprobs` recomputes the same quantity with gradients, so the GRPO ratio is
exactly 1 for unchanged weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from maze_policy.chat import Batch, ChatEncoder, Trajectory, collate
from maze_policy.sampling import SamplingParams
from maze_policy.vision_cache import install_vision_cache

VISION_TOKENS: tuple[str, ...] = (
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)


@dataclass(frozen=True, slots=True)
class Generation:
    """One sampled reply: new token ids (ending with ``<|im_end|>`` when ``finished``) and their log-probs."""

    token_ids: list[int]
    logprobs: list[float]
    finished: bool


def _unwrap(model: nn.Module) -> Any:
    # A peft PeftModel forwards attributes to the wrapped model; the config sits on the base.
    base = model
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base):
        base = cast(nn.Module, get_base())
    return base


def suppressed_token_ids(model: nn.Module, tokenizer: Any) -> list[int]:
    """Ids the policy must never emit: vision placeholders and embedding rows past the vocab."""
    vocab_rows = int(_unwrap(model).get_input_embeddings().weight.shape[0])
    ids = {int(tokenizer.convert_tokens_to_ids(t)) for t in VISION_TOKENS}
    ids.discard(int(getattr(tokenizer, "unk_token_id", None) or -1))
    ids = {i for i in ids if 0 <= i < vocab_rows}
    ids.update(range(len(tokenizer), vocab_rows))
    return sorted(ids)


def _policy_logprobs(
    logits: torch.Tensor, suppress: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """``log_softmax(logits / T)`` with suppressed ids at -inf; float32 for stable ratios."""
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    if suppress is not None and suppress.numel():
        x = x.index_fill(-1, suppress.to(x.device), float("-inf"))
    return torch.log_softmax(x, dim=-1)


class Policy:
    """A model + processor pair with the chat encoder and suppressed ids computed once."""

    def __init__(self, model: nn.Module, processor: Any) -> None:
        self.model = model
        self.processor = processor
        self.encoder = ChatEncoder(processor)
        # Multi-turn passes re-read every earlier frame; a frozen tower computes each once.
        self.vision_cache = install_vision_cache(model)
        self.suppress_ids = suppressed_token_ids(model, processor.tokenizer)
        base = _unwrap(model)
        gen_cfg = getattr(base, "generation_config", None)
        eos = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
        eos_list = [eos] if isinstance(eos, int) else list(cast(Sequence[int], eos or []))
        self.eos_ids: list[int] = sorted({self.encoder.eos_token_id, *eos_list})

    def collate(self, trajectories: Sequence[Trajectory], padding_side: str = "right") -> Batch:
        return collate(
            trajectories,
            pad_token_id=self.encoder.pad_token_id,
            image_token_id=self.encoder.image_token_id,
            video_token_id=self.encoder.video_token_id,
            padding_side=padding_side,
        )

    @torch.no_grad()
    def generate(
        self,
        trajectories: Sequence[Trajectory],
        params: SamplingParams,
        *,
        seed: int | None = None,
    ) -> list[Generation]:
        """Sample one reply per trajectory (batched, left-padded). Deterministic for a given ``seed``.

        The global torch RNG is left untouched when ``seed`` is given.
        """
        if not trajectories:
            return []
        batch = self.collate(trajectories, padding_side="left")
        kwargs: dict[str, Any] = {
            **batch.model_inputs(),
            "max_new_tokens": params.max_new_tokens,
            "do_sample": not params.greedy,
            "eos_token_id": self.eos_ids,
            "pad_token_id": self.encoder.pad_token_id,
            "suppress_tokens": self.suppress_ids,
            "output_logits": True,
            "return_dict_in_generate": True,
        }
        if not params.greedy:
            kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=0)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.random.fork_rng(devices=[], enabled=seed is not None):
                if seed is not None:
                    torch.manual_seed(seed)
                out = cast(Any, self.model).generate(**kwargs)
        finally:
            self.model.train(was_training)
        prompt_len = batch.input_ids.shape[1]
        seqs = cast(torch.Tensor, out.sequences)[:, prompt_len:]
        suppress = torch.tensor(self.suppress_ids, dtype=torch.long)
        steps = [
            _policy_logprobs(cast(torch.Tensor, lg), suppress, params.logprob_temperature)
            for lg in out.logits
        ]
        results: list[Generation] = []
        eos = set(self.eos_ids)
        for row in range(seqs.shape[0]):
            ids: list[int] = []
            lps: list[float] = []
            finished = False
            for t in range(seqs.shape[1]):
                tok = int(seqs[row, t])
                ids.append(tok)
                lps.append(float(steps[t][row, tok]))
                if tok in eos:
                    finished = True
                    break
            results.append(Generation(ids, lps, finished))
        return results


def sequence_logprobs(
    model: nn.Module,
    batch: Batch,
    *,
    temperature: float = 1.0,
    suppress_ids: Sequence[int] | None = None,
) -> torch.Tensor:
    """Per-token log-probs of ``batch.input_ids`` under ``model``, shape ``[B, L]``, with gradients.

    ``out[b, t]`` is ``log p(input_ids[b, t] | input_ids[b, :t], images)`` where
    ``batch.loss_mask[b, t]`` is 1 (the tokens the policy generated) and 0 elsewhere. Pass the
    same ``temperature`` and ``suppress_ids`` as at sampling time (see :class:`Policy`) for
    log-probs that match the recorded ones.
    """
    return sequence_logprobs_and_entropy(
        model, batch, temperature=temperature, suppress_ids=suppress_ids, entropy=False
    )[0]


def _body_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    # A Qwen-VL ForConditionalGeneration is ``model`` (vision + language model, ending in the
    # final norm) then ``lm_head``; peft's LoRA layers sit inside both, in place. A sharded
    # (FSDP2) model is called whole: its root's forward hooks gather the parameters it holds.
    from torch.distributed.tensor import DTensor

    if any(isinstance(p, DTensor) for p in model.parameters()):
        return None
    base = _unwrap(model)
    body, head = getattr(base, "model", None), getattr(base, "lm_head", None)
    if isinstance(body, nn.Module) and isinstance(head, nn.Module):
        return body, head
    return None


def _right_padded(attention_mask: torch.Tensor) -> bool:
    return bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())


def sequence_logprobs_and_entropy(
    model: nn.Module,
    batch: Batch,
    *,
    temperature: float = 1.0,
    suppress_ids: Sequence[int] | None = None,
    entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`sequence_logprobs` plus the policy distribution's entropy, from one forward pass.

    Both are ``[B, L]`` and hold values on the generated tokens (``batch.loss_mask``) only, 0
    elsewhere: the output head and the softmax run on those positions alone, which saves most
    of a pass's time and memory (a multi-turn sequence is mostly image and prompt tokens). The
    entropy carries no gradient.
    """
    inputs = batch.model_inputs()
    if _right_padded(batch.attention_mask):
        # Causal attention: padding after a row's last token never reaches a real one, so
        # without the mask the real tokens' outputs are the same and attention skips the
        # [B, L, L] mask (about 40% of a CPU forward).
        del inputs["attention_mask"]
    rows, cols = batch.loss_mask[:, 1:].nonzero(as_tuple=True)
    parts = _body_and_head(model)
    if parts is None:
        out = cast(Any, model)(**inputs, use_cache=False)
        logits = cast(torch.Tensor, out.logits)[rows, cols]
    else:
        body, head = parts
        hidden = cast(torch.Tensor, cast(Any, body)(**inputs, use_cache=False).last_hidden_state)
        logits = cast(torch.Tensor, head(hidden[rows, cols]))
    suppress = None if suppress_ids is None else torch.tensor(list(suppress_ids), dtype=torch.long)
    lp = _policy_logprobs(logits, suppress, temperature)
    target = batch.input_ids[rows, cols + 1].to(lp.device)
    picked = lp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    # A suppressed id in the text (never sampled, but a written reply can hold one) has -inf
    # log-prob; zero it with ``where`` so no -inf x 0 turns the loss or its gradient NaN.
    picked = torch.where(torch.isfinite(picked), picked, torch.zeros_like(picked))
    shape = batch.input_ids.shape
    where = (rows.to(lp.device), (cols + 1).to(lp.device))
    full = torch.zeros(shape, dtype=lp.dtype, device=lp.device).index_put(where, picked)
    ent: torch.Tensor | None = None
    if entropy:
        with torch.no_grad():
            # Suppressed ids have p = 0 and log p = -inf; they add nothing to the entropy.
            plogp = torch.where(torch.isfinite(lp), lp.exp() * lp, torch.zeros_like(lp))
            ent = torch.zeros(shape, dtype=lp.dtype, device=lp.device).index_put(
                where, -plogp.sum(-1)
            )
    return full, ent


def policy_logprobs(policy: Policy, batch: Batch, params: SamplingParams) -> torch.Tensor:
    """:func:`sequence_logprobs` with the policy's suppressed ids and the sampling temperature."""
    return policy_logprobs_and_entropy(policy, batch, params, entropy=False)[0]


def policy_logprobs_and_entropy(
    policy: Policy, batch: Batch, params: SamplingParams, *, entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`policy_logprobs` plus per-token policy entropy (see :func:`sequence_logprobs_and_entropy`)."""
    return sequence_logprobs_and_entropy(
        policy.model,
        batch,
        temperature=params.logprob_temperature,
        suppress_ids=policy.suppress_ids,
        entropy=entropy,
    )
