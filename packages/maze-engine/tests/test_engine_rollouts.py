"""The local engine's rollouts honour ``generator.max_turns`` as SkyRL's generator does."""

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from maze_engine.config import LocalConfig
from maze_engine.trainer import Rollouts
from maze_engine.workers import lora_config_from_skyrl
from maze_env import MazeSpec
from maze_env.export import build_rows
from maze_policy.sampling import SamplingParams


def _rows(seeds: list[int], slack: int) -> list[dict[str, Any]]:
    rows = build_rows(MazeSpec.parse("5x5"), seeds, split="validation", slack=slack)
    return json.loads(json.dumps(rows))  # plain JSON types, as read back from parquet


def test_max_turns_caps_episodes_below_the_maze_budget(tiny_vlm_dir: Path, tmp_path: Path) -> None:
    from skyrl.train.config import SkyRLLoraConfig

    lora = SkyRLLoraConfig(
        rank=4, alpha=8, dropout=0.0, target_modules="all-linear", exclude_modules=".*visual.*"
    )
    rollouts = Rollouts(
        tiny_vlm_dir, lora_config_from_skyrl(lora), LocalConfig(rollout_workers=0), tmp_path
    )
    rows = _rows([0, 1, 2], slack=2)  # 4 moves + stop + 2: a budget of 7 turns each
    assert {r["step_budget"] for r in rows} == {7}
    sampling = SamplingParams(greedy=True, max_new_tokens=8)
    # The untrained model never stops, so its episodes run to whatever ends them first.
    uncapped = rollouts.run(rows, [0, 1, 2], [0, 1, 2], sampling, seed=0)
    capped = rollouts.run(rows, [0, 1, 2], [0, 1, 2], sampling, seed=0, max_turns=5)
    assert [e.turns for e in uncapped] == [7, 7, 7]
    assert [e.turns for e in capped] == [5, 5, 5]
    assert not any(e.solved for e in capped)
    # The capped episode is the uncapped one's first five turns.
    assert capped[0].replies == uncapped[0].replies[:5]


def test_grpo_in_the_latest_context_trains_on_turn_sequences(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each turn is its own sequence through the warm start, rollouts, advantages and update."""
    import torch
    from safetensors.torch import load_file  # pyright: ignore[reportUnknownVariableType]

    from maze_engine.config import load_config
    from maze_engine.trainer import train
    from maze_policy.rollout import Episode

    played: list[Episode] = []
    run = Rollouts.run

    def alternate_rewards(self: Rollouts, *args: Any, **kwargs: Any) -> list[Episode]:
        # A barely trained model solves nothing; alternating rewards within each group make
        # the advantages nonzero (everything else is the real path).
        episodes = run(self, *args, **kwargs)
        for i, ep in enumerate(episodes):
            ep.reward = float(i % 2)
        played.extend(episodes)
        return episodes

    monkeypatch.setattr(Rollouts, "run", alternate_rewards)
    from maze_engine.grpo import step_advantages

    step_terms: list[list[torch.Tensor]] = []

    def record_steps(*args: Any, **kwargs: Any) -> list[torch.Tensor]:
        step_terms.append(step_advantages(*args, **kwargs))
        return step_terms[-1]

    monkeypatch.setattr("maze_engine.trainer.step_advantages", record_steps)
    from maze_engine.grpo import turn_reward_advantages

    turn_rewards: list[list[list[float]]] = []

    def record_turn_rewards(rewards: list[list[float]], *args: Any, **kwargs: Any) -> Any:
        turn_rewards.append(rewards)
        return turn_reward_advantages(rewards, *args, **kwargs)

    monkeypatch.setattr("maze_engine.trainer.turn_reward_advantages", record_turn_rewards)
    config = load_config(
        "smoke_5x5",
        [
            f"trainer.export_path={tmp_path / 'run'}",
            "local.warm_start.steps=3",
            "local.warm_start.reply=action",
            "local.warm_start.track_every=0",
            "trainer.max_training_steps=2",
            "trainer.train_batch_size=2",
            "trainer.policy_mini_batch_size=1",
            "trainer.micro_train_batch_size_per_gpu=2",
            "trainer.micro_forward_batch_size_per_gpu=2",
            "generator.n_samples_per_prompt=2",
            "generator.sampling_params.max_generate_length=12",
            "generator.max_turns=5",
            "trainer.eval_interval=0",
            "trainer.ckpt_interval=1",
            "trainer.eval_before_train=false",
            "trainer.policy.optimizer_config.lr=0.01",
            "local.rollout_workers=0",
            "local.context=latest",
            "local.step_advantage_weight=1.0",
            "local.progress_advantage_weight=1.0",
            "local.off_goal_stop_penalty=0.5",
            "mazes.train_size=8",
            "local.progress=false",
            "local.tensorboard=false",
        ],
    )
    result = train(config, say=lambda _m: None)
    # The rollouts answered each turn alone: one sequence per turn, one frame each.
    assert played and all(len(e.turn_trajectories) == e.turns for e in played)
    assert all(len(s.pixel_values) == 1 for e in played for s in e.sequences)
    # Every turn knows its square, and each step's turns got step-level terms (GiGPO).
    assert all(len(e.states) == e.turns for e in played)
    assert len(step_terms) == 2
    assert [len(t) for t in step_terms[0]] == [e.turns for e in played[: len(step_terms[0])]]
    steps = [row for row in result.history if "policy/grad_norm" in row]
    assert len(steps) == 2 and all(row["policy/grad_norm"] > 0 for row in steps)
    # The verifier judged every played turn; the step logs the share it found good.
    assert [[len(t) for t in step] for step in turn_rewards] == [
        [e.turns for e in played[:4]],
        [e.turns for e in played[4:8]],
    ]
    for step, row in zip(turn_rewards, steps, strict=True):
        flat = [v for turns in step for v in turns]
        assert set(flat) <= {0.0, 1.0, -0.5}
        assert row["reward/good_turn_rate"] == pytest.approx(flat.count(1.0) / len(flat))
    # A stop away from the goal (the env's own last outcome), and only that, earns the
    # penalty, on the episode's last turn.
    for episode, rewards in zip(played, [t for step in turn_rewards for t in step], strict=True):
        off_goal = episode.metadata.get("outcome") == "stopped" and not episode.solved
        assert [i for i, v in enumerate(rewards) if v < 0] == (
            [len(rewards) - 1] if off_goal else []
        )
    # The sampler's log-probs are the learner's on the same turn sequences.
    assert all(row["policy/rollout_train_logprob_abs_diff_max"] < 1e-3 for row in steps)
    ckpt = result.run_dir / "ckpt"
    first = load_file(
        str(ckpt / "global_step_1" / "policy" / "lora_adapter" / "adapter_model.safetensors")
    )
    final = load_file(str(result.final_adapter / "adapter_model.safetensors"))
    assert first.keys() == final.keys()
    assert any(not torch.equal(first[k], final[k]) for k in first)


def test_step_advantages_refuse_episodes_without_states(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An env whose steps name no agent square leaves ``Episode.states`` empty: the run stops
    naming the key instead of comparing turns it cannot place."""
    from maze_engine.errors import ConfigError
    from maze_engine.trainer import train
    from maze_policy.rollout import Episode

    run = Rollouts.run

    def stateless(self: Rollouts, *args: Any, **kwargs: Any) -> list[Episode]:
        episodes = run(self, *args, **kwargs)
        for ep in episodes:
            ep.states = []
        return episodes

    monkeypatch.setattr(Rollouts, "run", stateless)
    config = _one_prompt_run(
        tmp_path, 1, ["local.context=latest", "local.step_advantage_weight=1.0"]
    )
    with pytest.raises(ConfigError, match=r"local\.step_advantage_weight: needs each turn's state"):
        train(config, say=lambda _m: None)


def test_route_rehearsal_takes_a_supervised_step_after_each_grpo_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``local.route_rehearsal``: after each step's GRPO update, one step on that many route
    questions, drawn from the run's seed and the global step (so a resume draws them again)."""
    import torch

    from maze_engine import sft
    from maze_engine.trainer import Trainer, train
    from maze_policy.seeds import derive_seed

    seeds: list[int] = []
    shares: list[float] = []
    moved: list[bool] = []
    batch, rehearse = sft.route_rehearsal_batch, Trainer._rehearse_routes  # pyright: ignore[reportPrivateUsage]

    def record_batch(*args: Any, **kwargs: Any) -> Any:
        seeds.append(kwargs["seed"])
        shares.append(kwargs["stop_share"])
        return batch(*args, **kwargs)

    def record_step(self: Trainer) -> float:
        before = [p.detach().clone() for p in self.params]
        loss = rehearse(self)
        moved.append(any(not torch.equal(a, p) for a, p in zip(before, self.params, strict=True)))
        return loss

    monkeypatch.setattr(sft, "route_rehearsal_batch", record_batch)
    monkeypatch.setattr(Trainer, "_rehearse_routes", record_step)
    config = _one_prompt_run(
        tmp_path,
        2,
        ["local.context=route", "local.route_rehearsal=2", "local.route_stop_share=0.5"],
    )
    result = train(config, say=lambda _m: None)
    steps = [row for row in result.history if "policy/grad_norm" in row]
    assert len(steps) == 2
    assert all(row["policy/route_rehearsal_loss"] > 0 for row in steps)
    seed = int(config.skyrl.trainer.seed)
    assert seeds == [derive_seed(seed, "grpo-route-rehearsal", step) for step in (0, 1)]
    assert shares == [0.5, 0.5]
    assert moved == [True, True]


def test_the_learning_rate_follows_skyrls_scheduler_over_every_mini_batch_update(
    tmp_path: Path,
) -> None:
    """``optimizer_config.scheduler`` and ``num_warmup_steps`` as SkyRL's worker reads them
    (transformers' schedule over steps x mini-batches x epochs), not a constant rate."""
    from maze_engine.trainer import train

    config = _one_prompt_run(
        tmp_path,
        3,
        [
            "trainer.policy.optimizer_config.lr=1e-3",
            "trainer.policy.optimizer_config.scheduler=linear",
            "trainer.policy.optimizer_config.num_warmup_steps=2",
            "trainer.update_epochs_per_batch=2",
        ],
    )
    result = train(config, say=lambda _m: None)
    lrs = [row["policy/policy_lr"] for row in result.history if "policy/grad_norm" in row]
    # 6 updates (3 steps x 1 mini-batch x 2 epochs), warmed up over 2 and decayed linearly to
    # 0 after: each step logs its last update's rate (updates 2, 4 and 6).
    assert lrs == pytest.approx([5e-4, 0.75e-3, 0.25e-3])


def test_the_policy_loss_is_looked_up_once_per_run_not_per_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SkyRL's ``PolicyLossRegistry.get`` syncs with a Ray actor while Ray is up; the learner
    resolves the loss once at start-up, so no update waits on (or dies with) that actor."""
    from skyrl.backends.skyrl_train.utils.ppo_utils import PolicyLossRegistry

    from maze_engine.trainer import train

    get: Any = PolicyLossRegistry.get  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType] - SkyRL types the function it returns loosely
    names: list[str] = []

    def counted(name: str) -> Any:
        names.append(name)
        return get(name)

    monkeypatch.setattr(PolicyLossRegistry, "get", counted)
    config = _one_prompt_run(tmp_path, 3, ["trainer.update_epochs_per_batch=2"])
    result = train(config, say=lambda _m: None)
    assert len([row for row in result.history if "policy/grad_norm" in row]) == 3
    assert names == ["regular"]  # 6 updates, one lookup


@pytest.mark.parametrize("epochs", [1, 2])
def test_clip_bounds_a_one_update_step_cannot_reach_are_named_at_start_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, epochs: int
) -> None:
    """With one update a step every PPO ratio is 1, so a changed clip bound changes nothing:
    the run says so instead of training as if it were active."""
    from skyrl.train.config import AlgorithmConfig

    from maze_engine.grpo import clip_settings_changed
    from maze_engine.trainer import train

    assert clip_settings_changed(AlgorithmConfig()) == []
    assert clip_settings_changed(AlgorithmConfig(eps_clip_high=0.28, clip_ratio_c=10.0)) == [
        "eps_clip_high",
        "clip_ratio_c",
    ]
    config = _one_prompt_run(
        tmp_path,
        1,
        ["trainer.algorithm.eps_clip_high=0.28", f"trainer.update_epochs_per_batch={epochs}"],
    )
    with caplog.at_level(logging.WARNING, logger="maze_engine.trainer"):
        train(config, say=lambda _m: None)
    warned = [r.getMessage() for r in caplog.records if "no effect" in r.getMessage()]
    if epochs == 1:
        assert warned == [
            "trainer.algorithm.eps_clip_high: no effect, each step makes one update "
            "(train_batch_size 1 <= policy_mini_batch_size 1, update_epochs_per_batch 1), "
            "so the PPO ratio is 1"
        ]
    else:  # a second epoch updates on the first's old log-probs: the bound can bind
        assert warned == []


def _one_prompt_run(tmp_path: Path, steps: int, overrides: list[str]) -> Any:
    """A smoke run of ``steps`` GRPO steps on one prompt of two samples, no warm start or eval."""
    from maze_engine.config import load_config

    return load_config(
        "smoke_5x5",
        [
            f"trainer.export_path={tmp_path / 'run'}",
            "local.warm_start.steps=0",
            f"trainer.max_training_steps={steps}",
            "trainer.train_batch_size=1",
            "trainer.policy_mini_batch_size=1",
            "trainer.micro_train_batch_size_per_gpu=2",
            "trainer.micro_forward_batch_size_per_gpu=2",
            "generator.n_samples_per_prompt=2",
            "generator.sampling_params.max_generate_length=8",
            "generator.max_turns=5",
            "trainer.eval_interval=0",
            "trainer.eval_before_train=false",
            "local.rollout_workers=0",
            "mazes.train_size=4",
            "local.progress=false",
            "local.tensorboard=false",
            *overrides,
        ],
    )
