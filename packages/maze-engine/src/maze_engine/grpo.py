"""GRPO losses from SkyRL's own functions, composed as SkyRL's FSDP worker composes them.

Advantages come from SkyRL's advantage-estimator registry (``grpo``: group-normalised outcome
reward, ``grpo_norm_by_std=False`` for Dr. GRPO), the loss reduction from
``apply_loss_reduction_to_advantages_minibatch`` (``token_mean``, ``seq_mean_token_sum_norm``
for Dr. GRPO, ...), the policy loss from ``PolicyLossRegistry`` (``regular`` PPO clip with
``eps_clip_low``/``eps_clip_high`` for clip-higher, ``gspo``, ``cispo``, ...), and the optional KL
term from ``compute_approx_kl``. The math is therefore the cluster's, key for key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch
from skyrl.backends.skyrl_train.utils.ppo_utils import (
    PolicyLossRegistry,
    apply_loss_reduction_to_advantages_minibatch,
    compute_advantages_and_returns,  # pyright: ignore[reportUnknownVariableType]
    compute_approx_kl,
)
from skyrl.backends.skyrl_train.utils.torch_utils import masked_mean
from skyrl.train.config import AlgorithmConfig


def outcome_token_rewards(rewards: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Place each episode's scalar reward on its last loss token, as SkyRL does."""
    token_rewards = torch.zeros_like(loss_mask, dtype=torch.float32)
    positions = torch.arange(loss_mask.shape[1]).expand_as(loss_mask)
    last = torch.where(loss_mask > 0, positions, -1).max(dim=1).values
    has = last >= 0
    token_rewards[has, last[has]] = rewards[has].float()
    return token_rewards


def compute_advantages(
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    group_ids: npt.NDArray[Any],
    algo: AlgorithmConfig,
) -> torch.Tensor:
    """Per-token advantages (B, T) for episodes whose GRPO group is ``group_ids[i]``."""
    advantages, _returns = compute_advantages_and_returns(
        token_level_rewards=outcome_token_rewards(rewards, loss_mask),
        response_mask=loss_mask.float(),
        index=np.asarray(group_ids),
        adv_estimator=algo.advantage_estimator,  # pyright: ignore[reportArgumentType]
        config=algo,
        grpo_norm_by_std=algo.grpo_norm_by_std,
        gamma=algo.gamma,
        lambd=algo.lambd,
    )
    if algo.advantage_batch_normalize:
        n = loss_mask.sum().clamp(min=1)
        mean = advantages.mean()
        var = ((advantages - mean).pow(2) * loss_mask).sum() / n
        advantages = (advantages - mean) * var.clamp(min=1e-8).rsqrt()
    return advantages


def episode_advantages(
    rewards: torch.Tensor, group_ids: npt.NDArray[Any], algo: AlgorithmConfig
) -> torch.Tensor:
    """One advantage per episode (E,): :func:`compute_advantages` of a one-token response each.

    For episodes played as several sequences (one per turn, rollout context ``latest``): the
    group statistics are over episodes, as for whole conversations, whatever their turns.
    """
    return compute_advantages(rewards, torch.ones((len(rewards), 1)), group_ids, algo)[:, 0]


def step_advantages(
    rewards: Sequence[float],
    group_ids: Sequence[Any],
    states: Sequence[Sequence[str]],
    *,
    gamma: float,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> list[torch.Tensor]:
    """Step-level advantages (GiGPO's anchor-state groups), one tensor of turns per episode.

    Turn ``t`` of an episode of ``T`` turns that ends with reward ``R`` returns
    ``gamma ** (T - 1 - t) * R``. The turns of one GRPO group answered in the same env state
    (``states[e][t]``) form a step group, and a turn's advantage is its return against that
    group's mean (over its std with ``norm_by_std``). A turn whose state no other turn of the
    group met, or whose step group returned alike, gets 0: only the decisions the group's
    episodes took differently, from the same state, are told apart.
    """
    if not len(rewards) == len(group_ids) == len(states):
        raise ValueError(
            f"{len(rewards)} rewards, {len(group_ids)} group ids and {len(states)} state lists"
        )
    returns = [
        [gamma ** (len(turns) - 1 - t) * float(r) for t in range(len(turns))]
        for r, turns in zip(rewards, states, strict=True)
    ]
    members: dict[tuple[Any, str], list[tuple[int, int]]] = {}
    for e, (g, turns) in enumerate(zip(group_ids, states, strict=True)):
        for t, key in enumerate(turns):
            members.setdefault((g, key), []).append((e, t))
    out = [torch.zeros(len(turns)) for turns in states]
    for turns in members.values():
        if len(turns) < 2:
            continue
        values = torch.tensor([returns[e][t] for e, t in turns], dtype=torch.float64)
        centred = values - values.mean()
        if norm_by_std:
            centred = centred / (values.std() + epsilon)
        for (e, t), a in zip(turns, cast(list[float], centred.tolist()), strict=True):
            out[e][t] = a
    return out


def turn_reward_advantages(
    turn_rewards: Sequence[Sequence[float]],
    group_ids: Sequence[Any],
    *,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> list[torch.Tensor]:
    """Advantages of per-turn rewards, one tensor of turns per episode.

    Every turn of a GRPO group's episodes is scored against the mean of all that group's turns
    (over their std with ``norm_by_std``): GRPO's group baseline, taken over decisions instead of
    episodes. A group whose turns all scored alike gives 0.
    """
    if len(turn_rewards) != len(group_ids):
        raise ValueError(
            f"{len(turn_rewards)} episodes of turn rewards, {len(group_ids)} group ids"
        )
    members: dict[Any, list[int]] = {}
    for e, g in enumerate(group_ids):
        members.setdefault(g, []).append(e)
    out = [torch.zeros(len(turns)) for turns in turn_rewards]
    for episodes in members.values():
        values = torch.tensor(
            [float(v) for e in episodes for v in turn_rewards[e]], dtype=torch.float64
        )
        if len(values) < 2:
            continue
        centred = values - values.mean()
        if norm_by_std:
            centred = centred / (values.std() + epsilon)
        at = 0
        for e in episodes:
            k = len(turn_rewards[e])
            out[e] = centred[at : at + k].to(torch.float32)
            at += k
    return out


def sequence_advantages(
    per_episode: torch.Tensor,
    counts: Sequence[int],
    loss_mask: torch.Tensor,
    per_turn: Sequence[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Per-token advantages (S, T): each episode's advantage on its sequences' generated tokens.

    Episode ``e`` owns ``counts[e]`` consecutive rows of ``loss_mask``, in episode order.
    ``per_turn[e]`` (one value per sequence, e.g. :func:`step_advantages` times its weight) is
    added to the episode's advantage on its turns.
    """
    if len(counts) != len(per_episode) or sum(counts) != loss_mask.shape[0]:
        raise ValueError(
            f"{len(per_episode)} episodes with {sum(counts)} sequences in all, but "
            f"{len(counts)} counts and {loss_mask.shape[0]} rows"
        )
    each = per_episode.repeat_interleave(torch.tensor(list(counts), dtype=torch.long))
    if per_turn is not None:
        if [len(t) for t in per_turn] != list(counts):
            raise ValueError(
                f"per-turn advantages for {[len(t) for t in per_turn]} turns, but the "
                f"episodes have {list(counts)} sequences"
            )
        each = each + torch.cat([t.to(each.dtype) for t in per_turn])
    return each[:, None] * loss_mask.float()


def lr_scheduler(
    optimizer: torch.optim.Optimizer, name: str, *, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """The learning-rate schedule SkyRL's FSDP worker builds from ``optimizer_config``.

    transformers' ``get_scheduler`` with the config's ``scheduler`` and ``num_warmup_steps``, over
    ``total_steps`` mini-batch updates (the run's steps x mini-batches x update epochs), so a
    ``cosine`` run decays on this engine exactly as on the cluster. ``name`` must be one of
    :data:`maze_engine.schema.LR_SCHEDULERS`.
    """
    from transformers import get_scheduler  # pyright: ignore[reportUnknownVariableType]

    from maze_engine.errors import ConfigError
    from maze_engine.schema import LR_SCHEDULERS

    if name not in LR_SCHEDULERS:
        raise ConfigError(
            f"{name!r} is not a schedule SkyRL can build",
            key="trainer.policy.optimizer_config.scheduler",
            allowed=LR_SCHEDULERS,
        )
    return cast(
        torch.optim.lr_scheduler.LRScheduler,
        get_scheduler(
            name, optimizer, num_warmup_steps=warmup_steps, num_training_steps=total_steps
        ),
    )


@dataclass(frozen=True)
class LossOutput:
    """The loss to backpropagate and its scalar metrics under SkyRL's names."""

    loss: torch.Tensor
    metrics: dict[str, float]


PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, Any]]]
"""A SkyRL policy loss: ``(logprobs, old_logprobs, advantages, algo, loss_mask)`` to
``(loss, metrics)``."""


CLIP_SETTINGS = ("eps_clip_low", "eps_clip_high", "clip_ratio_c")
"""The PPO ratio's clip bounds: inert when a step updates once on its own old log-probs."""


def clip_settings_changed(algo: AlgorithmConfig) -> list[str]:
    """The :data:`CLIP_SETTINGS` that ``algo`` sets away from SkyRL's defaults."""
    default = type(algo)()
    return [k for k in CLIP_SETTINGS if float(getattr(algo, k)) != float(getattr(default, k))]


def resolve_policy_loss(algo: AlgorithmConfig) -> PolicyLossFn:
    """SkyRL's policy loss named by ``algo.policy_loss_type``, looked up once per run.

    While Ray is up, ``PolicyLossRegistry.get`` syncs with the registry's named Ray actor on
    every call: looked up per update, that is a round trip on the learner's hot path, and a run
    whose registry actor Ray's memory monitor has killed stops in the middle of a step.
    """
    return cast(PolicyLossFn, PolicyLossRegistry.get(algo.policy_loss_type))  # pyright: ignore[reportUnknownMemberType]


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    algo: AlgorithmConfig,
    *,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    loss_fn: PolicyLossFn | None = None,
) -> LossOutput:
    """The scalar to backpropagate for one mini-batch, plus SkyRL-named metrics.

    ``loss_fn`` is :func:`resolve_policy_loss` of ``algo``, looked up here when not given.
    """
    mask = loss_mask.float()
    scaled = apply_loss_reduction_to_advantages_minibatch(
        advantages=advantages,
        loss_mask=mask,
        loss_reduction=algo.loss_reduction,
        micro_batch_size=advantages.shape[0],
        max_seq_len=max_seq_len or algo.max_seq_len or advantages.shape[1],
    )
    if loss_fn is None:
        loss_fn = resolve_policy_loss(algo)
    pg_loss, loss_metrics = loss_fn(logprobs, old_logprobs, scaled, algo, mask)
    total = pg_loss
    metrics: dict[str, float] = {"policy/policy_loss": float(pg_loss.detach())}
    metrics.update({f"policy/{k}": float(v) for k, v in loss_metrics.items()})
    if entropy is not None:
        ent = masked_mean(entropy, mask)
        metrics["policy/policy_entropy"] = float(ent.detach())
        if algo.use_entropy_loss:
            total = total - algo.entropy_loss_coef * ent
    if algo.use_kl_loss:
        if ref_logprobs is None:
            raise ValueError("trainer.algorithm.use_kl_loss=true needs reference logprobs")
        kl = compute_approx_kl(
            logprobs, ref_logprobs, loss_mask=mask, kl_estimator_type=algo.kl_estimator_type
        )
        kl_mean = masked_mean(kl, mask, dim=-1).mean()
        total = total + algo.kl_loss_coef * kl_mean
        metrics["policy/policy_kl"] = float(kl_mean.detach())
    metrics["policy/final_loss"] = float(total.detach())
    return LossOutput(total, metrics)
