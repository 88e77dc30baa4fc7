import json
import math
import urllib.request
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch
from skyrl.backends.skyrl_train.utils.ppo_utils import (
    PolicyLossRegistry,
    compute_grpo_outcome_advantage,  # pyright: ignore[reportUnknownVariableType]
)
from skyrl.train.config import AlgorithmConfig

from maze_engine.grpo import (
    compute_advantages,
    outcome_token_rewards,
    policy_loss,
    resolve_policy_loss,
)
from maze_engine.metrics import MetricsSink, prometheus_name


def test_metrics_reach_jsonl_tensorboard_and_prometheus(tmp_path: Path) -> None:
    sink = MetricsSink(tmp_path / "m.jsonl", tmp_path / "tb", prometheus_port=0)
    try:
        sink.log(1, {"reward/avg_raw_reward": 0.25, "eval/all/pass_at_1": 0.5, "bad": math.nan})
        sink.log(2, {"reward/avg_raw_reward": 0.75})
        assert sink.prometheus_port
        body = (
            urllib.request.urlopen(f"http://127.0.0.1:{sink.prometheus_port}/metrics", timeout=5)
            .read()
            .decode()
        )
        assert "mazerl_reward_avg_raw_reward 0.75" in body
        assert "mazerl_eval_all_pass_at_1 0.5" in body and "mazerl_global_step 2.0" in body
    finally:
        sink.close()
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert lines == [
        {"global_step": 1, "reward/avg_raw_reward": 0.25, "eval/all/pass_at_1": 0.5},
        {"global_step": 2, "reward/avg_raw_reward": 0.75},
    ]
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert prometheus_name("timing/step") == "mazerl_timing_step"


def test_advantages_are_skyrls_grpo() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    mask = torch.zeros(8, 6)
    mask[:, 2:5] = 1
    groups = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    adv = compute_advantages(rewards, mask, groups, AlgorithmConfig())
    expected = cast(
        torch.Tensor,
        compute_grpo_outcome_advantage(outcome_token_rewards(rewards, mask), mask, groups)[0],
    )
    assert torch.equal(adv, expected)
    # (r - mean) / (unbiased std + eps) within each group, on loss tokens only.
    assert adv[0, 3].item() == pytest.approx(0.5 / (np.std([1, 0, 0, 1], ddof=1) + 1e-6), rel=1e-5)
    assert adv[:, :2].abs().sum() == 0 and adv[:, 5:].abs().sum() == 0
    dr = compute_advantages(rewards, mask, groups, AlgorithmConfig(grpo_norm_by_std=False))
    assert dr[0, 3].item() == pytest.approx(0.5)


def test_turn_sequences_share_their_episodes_group_advantage() -> None:
    from maze_engine.grpo import episode_advantages, sequence_advantages

    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    groups = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    algo = AlgorithmConfig()
    per_episode = episode_advantages(rewards, groups, algo)
    # The same value a whole conversation's tokens get, however many turns an episode had.
    mask = torch.zeros(8, 6)
    mask[:, 2:5] = 1
    assert torch.equal(per_episode, compute_advantages(rewards, mask, groups, algo)[:, 3])
    counts = [3, 1, 2, 1, 1, 4, 2, 1]
    turns = torch.zeros(sum(counts), 5)
    turns[:, 1:3] = 1
    adv = sequence_advantages(per_episode, counts, turns)
    owner = [e for e, c in enumerate(counts) for _ in range(c)]
    for row, e in enumerate(owner):
        assert torch.equal(adv[row, 1:3], per_episode[e].expand(2))
    assert adv[:, 0].abs().sum() == 0 and adv[:, 3:].abs().sum() == 0
    assert adv[:3, 1].unique().numel() == 1 and float(adv[0, 1]) > 0 > float(adv[3, 1])
    with pytest.raises(ValueError, match="15 sequences in all, but 8 counts and 14 rows"):
        sequence_advantages(per_episode, counts, turns[:-1])


def test_step_advantages_compare_turns_of_a_group_on_the_same_square() -> None:
    from maze_engine.grpo import episode_advantages, sequence_advantages, step_advantages

    g = 0.9
    # Group 0: episode 0 reaches the goal in 3 turns; episode 1 turns off at the start square and
    # runs out of turns in a dead end; episode 2 (group 1) starts on the same square, alone.
    rewards = [1.0, 0.0, 1.0]
    groups = [0, 0, 1]
    states = [["0,0", "0,1", "1,1"], ["0,0", "1,0", "1,0", "1,0"], ["0,0", "0,1"]]
    steps = step_advantages(rewards, groups, states, gamma=g)
    # The start square: returns g**2 and 0, centred over their (n - 1) std: +-1/sqrt(2).
    assert steps[0][0].item() == pytest.approx(2**-0.5, rel=1e-5)
    assert steps[1][0].item() == pytest.approx(-(2**-0.5), rel=1e-5)
    # Squares one episode of the group met alone, or met only by turns that returned alike,
    # and a group of one, tell nothing apart.
    assert steps[0][1:].abs().sum() == 0 and steps[1][1:].abs().sum() == 0
    assert steps[2].abs().sum() == 0
    assert [len(t) for t in steps] == [3, 4, 2]
    plain = step_advantages(rewards, groups, states, gamma=g, norm_by_std=False)
    assert plain[0][0].item() == pytest.approx(g**2 / 2) and plain[1][0].item() == pytest.approx(
        -(g**2) / 2
    )
    # Reaching the goal sooner from the same square is worth more (the discount).
    faster = step_advantages([1.0, 1.0], [0, 0], [["a", "b"], ["a", "c", "d"]], gamma=g)
    assert faster[0][0].item() > 0 > faster[1][0].item()
    with pytest.raises(ValueError, match="2 rewards, 3 group ids and 3 state lists"):
        step_advantages(rewards[:2], groups, states, gamma=g)
    # Added to each turn's episode advantage on its generated tokens.
    per_episode = episode_advantages(torch.tensor(rewards), np.array(groups), AlgorithmConfig())
    counts = [3, 4, 2]
    mask = torch.ones(9, 2)
    adv = sequence_advantages(per_episode, counts, mask, steps)
    assert adv[0, 0].item() == pytest.approx(per_episode[0].item() + 2**-0.5, rel=1e-5)
    assert adv[3, 1].item() == pytest.approx(per_episode[1].item() - 2**-0.5, rel=1e-5)
    assert torch.equal(adv[1:3], per_episode[0].expand(2, 2))
    with pytest.raises(ValueError, match=r"per-turn advantages for \[3, 4\] turns"):
        sequence_advantages(per_episode, counts, mask, steps[:2])


def test_turn_reward_advantages_use_the_groups_turns_as_baseline() -> None:
    from maze_engine.grpo import turn_reward_advantages

    # Group 0: 3 good turns of 5 (mean 0.6); group 1: every turn alike; group 2: one turn.
    rewards = [[1.0, 1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0], [0.0]]
    groups = [0, 0, 1, 1, 2]
    adv = turn_reward_advantages(rewards, groups, norm_by_std=False)
    assert [len(a) for a in adv] == [3, 2, 2, 1, 1]
    assert adv[0].tolist() == pytest.approx([0.4, 0.4, -0.6]) and adv[1].tolist() == pytest.approx(
        [-0.6, 0.4]
    )
    assert adv[2].abs().sum() == 0 and adv[3].abs().sum() == 0 and adv[4].abs().sum() == 0
    scaled = turn_reward_advantages(rewards, groups)
    std = float(torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0]).std())
    assert scaled[0][0].item() == pytest.approx(0.4 / std, rel=1e-5)
    with pytest.raises(ValueError, match="5 episodes of turn rewards, 4 group ids"):
        turn_reward_advantages(rewards, groups[:4])


def test_policy_loss_gradient_pushes_up_good_actions() -> None:
    algo = AlgorithmConfig(use_kl_loss=False, eps_clip_low=0.2, eps_clip_high=0.28)
    mask = torch.ones(2, 4)
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4])
    logits = torch.zeros(2, 4, requires_grad=True)
    out = policy_loss(logits, logits.detach(), adv, mask, algo)
    out.loss.backward()
    assert logits.grad is not None
    assert (logits.grad[0] < 0).all() and (logits.grad[1] > 0).all()  # descent raises row 0
    assert "policy/clip_ratio" in out.metrics


def test_a_resolved_policy_loss_is_used_without_asking_the_registry_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    algo = AlgorithmConfig(use_kl_loss=False, eps_clip_low=0.2, eps_clip_high=0.28)
    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old, adv, mask = torch.tensor([[-1.2, -1.9, -0.4]]), torch.ones(1, 3), torch.ones(1, 3)
    looked_up = policy_loss(lp, old, adv, mask, algo)
    fn = resolve_policy_loss(algo)

    def no_registry(name: str) -> Any:
        raise AssertionError(f"registry asked for {name!r}")

    monkeypatch.setattr(PolicyLossRegistry, "get", no_registry)
    given = policy_loss(lp, old, adv, mask, algo, loss_fn=fn)
    assert torch.equal(given.loss, looked_up.loss)
    assert given.metrics == looked_up.metrics
    with pytest.raises(AssertionError, match="registry asked for 'regular'"):
        policy_loss(lp, old, adv, mask, algo)


def test_kl_term_needs_reference_and_is_reported() -> None:
    algo = AlgorithmConfig(use_kl_loss=True, kl_loss_coef=0.1)
    lp = torch.full((1, 3), -1.0, requires_grad=True)
    with pytest.raises(ValueError, match="use_kl_loss"):
        policy_loss(lp, lp.detach(), torch.zeros(1, 3), torch.ones(1, 3), algo)
    out = policy_loss(
        lp,
        lp.detach(),
        torch.zeros(1, 3),
        torch.ones(1, 3),
        algo,
        ref_logprobs=torch.full((1, 3), -2.0),
    )
    assert out.metrics["policy/policy_kl"] > 0
