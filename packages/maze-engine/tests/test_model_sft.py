from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from maze_engine.config import WarmStartConfig
from maze_engine.sft import (
    action_accuracy,
    demonstration,
    demonstration_sequences,
    evaluate_policy,
    oracle_episode,
    run_sft,
    save_merged,
    sft_loss,
)
from maze_env import generate
from maze_policy.chat import Trajectory
from maze_policy.model import load_vlm
from maze_policy.policy import Policy, sequence_logprobs


def test_oracle_episode_masks_every_reply(tiny_policy: Policy) -> None:
    maze = generate("7x7", 5)
    traj = oracle_episode(tiny_policy, maze)
    # One reply per optimal move plus the stop, one image per turn.
    assert len(traj.generated_spans()) == maze.optimal_moves + 1
    assert len(traj.images) == maze.optimal_moves + 1


def test_oracle_episode_states_the_turn_budget_it_is_given(tiny_policy: Policy) -> None:
    """Demonstrations show the budget GRPO and the evaluation give (the replies depend on it)."""
    maze = generate("7x7", 5)
    tok = tiny_policy.processor.tokenizer

    def text(slack: int | None) -> str:
        return str(tok.decode(oracle_episode(tiny_policy, maze, slack=slack).input_ids))

    tight = text(2)
    assert f"You have {maze.step_budget(2)} turns" in tight
    assert f"You have {maze.step_budget()} turns" in text(None)
    assert f"You have {maze.step_budget()} turns" not in tight


def test_explorer_demonstrations_are_partial_solutions_in_action_tags(tiny_policy: Policy) -> None:
    import random

    from maze_engine.decisions import replay
    from maze_env import get_eval_set

    tok = tiny_policy.processor.tokenizer
    rng = random.Random(0)
    outcomes: list[bool] = []
    for maze in get_eval_set("small-64").mazes[:12]:
        traj, solved = demonstration(
            tiny_policy, maze, demonstrator="explorer", reply="action", slack=2, rng=rng
        )
        replies = [
            str(tok.decode(traj.input_ids[a:b], skip_special_tokens=True))
            for a, b in traj.generated_spans()
        ]
        assert all(r.startswith("<action>") and r.endswith("</action>") for r in replies)
        out = replay(maze, replies, maze.step_budget(2))
        assert out.bumps == 0 and out.solved == solved  # reads every wall; the replay agrees
        assert solved or len(replies) == maze.step_budget(2)  # else the budget ran out
        outcomes.append(solved)
    assert any(outcomes) and not all(outcomes)  # a partial solver at the eval's budget
    with pytest.raises(ValueError, match="demonstrator must be"):
        demonstration(tiny_policy, generate("5x5", 0), demonstrator="teacher")


def test_latest_context_demonstrations_show_each_turn_alone(tiny_policy: Policy) -> None:
    """One sequence per turn (the system prompt, that turn's frame and feedback, the reply), the
    same replies as the whole conversation's."""
    tok = tiny_policy.processor.tokenizer
    maze = generate("7x7", 5)
    whole, solved = demonstration(tiny_policy, maze, reply="action", slack=2)
    turns, solved_too = demonstration_sequences(
        tiny_policy, maze, context="latest", reply="action", slack=2
    )
    assert solved and solved_too and len(turns) == maze.optimal_moves + 1
    assert turns[0].input_ids == whole.input_ids[: len(turns[0])]  # the opening turn is shared

    def replies(seqs: list[Trajectory]) -> list[str]:
        return [
            str(tok.decode(s.input_ids[a:b], skip_special_tokens=True))
            for s in seqs
            for a, b in s.generated_spans()
        ]

    assert replies(turns) == replies([whole])
    for seq in turns:
        assert len(seq.images) == 1 and len(seq.generated_spans()) == 1
        assert str(tok.decode(seq.input_ids)).count("You are navigating a maze") == 1
    with pytest.raises(ValueError, match="context must be one of"):
        demonstration_sequences(tiny_policy, maze, context="window")
    # ``recent``: the same turns with the reply before each later one ahead of its feedback.
    recent, _ = demonstration_sequences(
        tiny_policy, maze, context="recent", reply="action", slack=2
    )
    assert replies(recent) == replies(turns)
    assert recent[0].input_ids == turns[0].input_ids
    said = replies(turns)
    for t, seq in enumerate(recent[1:], start=1):
        prompt = str(tok.decode(seq.input_ids[: seq.generated_spans()[0][0]]))
        assert len(seq.images) == 1
        assert prompt.count(said[t - 1]) == 1 and prompt.index(said[t - 1]) < prompt.index(
            "Turns left"
        )
    # ``route``: the same replies, each turn's frame asked the route question and nothing else.
    from maze_policy.contexts import ROUTE_QUESTION

    route, _ = demonstration_sequences(tiny_policy, maze, context="route", reply="action", slack=2)
    assert replies(route) == replies(turns)
    for seq, latest in zip(route, turns, strict=True):
        prompt = str(tok.decode(seq.input_ids[: seq.generated_spans()[0][0]]))
        assert len(seq.images) == 1 and prompt.count(ROUTE_QUESTION) == 1
        assert "You are navigating a maze" not in prompt and "Turns left" not in prompt
        assert seq.pixel_values[0].equal(latest.pixel_values[0])  # the same frame
    # ``route-recent``: the route turns, each later one after the reply that led to its frame.
    came, _ = demonstration_sequences(
        tiny_policy, maze, context="route-recent", reply="action", slack=2
    )
    assert replies(came) == replies(turns)
    assert came[0].input_ids == route[0].input_ids
    for t, (seq, asked) in enumerate(zip(came[1:], route[1:], strict=True), start=1):
        prompt = str(tok.decode(seq.input_ids[: seq.generated_spans()[0][0]]))
        assert len(seq.images) == 1 and prompt.count(ROUTE_QUESTION) == 1
        assert prompt.count(said[t - 1]) == 1 and prompt.index(said[t - 1]) < prompt.index(
            ROUTE_QUESTION
        )
        assert len(seq) > len(asked) and seq.pixel_values[0].equal(asked.pixel_values[0])


def test_short_sft_lowers_loss_and_raises_action_accuracy(
    tiny_policy: Policy, tmp_path: Path
) -> None:
    held_out = [oracle_episode(tiny_policy, generate("5x5", s)) for s in range(4)]
    with torch.no_grad():
        loss0 = float(sft_loss(tiny_policy, held_out))
    acc0 = action_accuracy(tiny_policy, held_out)
    res0 = evaluate_policy(tiny_policy, "5x5", [0, 1], max_new_tokens=32)
    cfg = WarmStartConfig(steps=40, batch_size=2, lr=5e-3, warmup_steps=5, max_seconds=90)
    report = run_sft(tiny_policy, cfg, spec="5x5", seed=0, cell_px=32, out_dir=tmp_path / "sft")
    assert report.steps_done >= 10 and len(report.losses) == report.steps_done
    assert report.config["spec"] == "5x5" and report.config["steps"] == 40
    with torch.no_grad():
        loss1 = float(sft_loss(tiny_policy, held_out))
    acc1 = action_accuracy(tiny_policy, held_out)
    assert loss1 < 0.5 * loss0
    assert acc1 > acc0 and acc1 >= 0.2  # the action slot now holds action words

    # The saved directory is a normal checkpoint that reproduces the trained policy exactly.
    model2, proc2 = load_vlm(tmp_path / "sft")
    again = Policy(model2, proc2)
    batch = tiny_policy.collate(held_out[:2])
    with torch.no_grad():
        a = sequence_logprobs(tiny_policy.model, batch, suppress_ids=tiny_policy.suppress_ids)
        b = sequence_logprobs(again.model, batch, suppress_ids=again.suppress_ids)
    assert torch.allclose(a, b, atol=1e-5)
    assert (tmp_path / "sft" / "sft_report.json").is_file()

    # End to end through the skyrl-gym env: the SFT'd model now answers with parseable actions.
    res = evaluate_policy(again, "5x5", [0, 1], max_new_tokens=32)
    assert res.episodes == 2 and res.valid_action_rate > res0.valid_action_rate


def test_save_merged_merges_lora(tiny_policy: Policy, tmp_path: Path) -> None:
    from maze_policy.lora import apply_lora, lora_config

    peft_model = apply_lora(tiny_policy.model, lora_config(rank=2, alpha=4))
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    policy = Policy(peft_model, tiny_policy.processor)
    batch = policy.collate([oracle_episode(policy, generate("5x5", 0))])
    with torch.no_grad():
        before = sequence_logprobs(policy.model, batch, suppress_ids=policy.suppress_ids)
    save_merged(policy, tmp_path / "merged")
    model2, _ = load_vlm(tmp_path / "merged")
    assert not any("lora" in k for k in model2.state_dict())
    with torch.no_grad():
        after = sequence_logprobs(model2, batch, suppress_ids=policy.suppress_ids)
    assert torch.allclose(before, after, atol=1e-4)


def test_run_sft_trains_every_step_unless_max_seconds_stops_it(tiny_policy: Policy) -> None:
    every = run_sft(
        tiny_policy,
        WarmStartConfig(steps=2, batch_size=1, warmup_steps=1),
        spec="5x5",
        seed=0,
        cell_px=32,
    )
    assert every.steps_done == 2 and len(every.losses) == 2 and every.seconds > 0
    # The budget is checked before each step: the first always runs.
    capped = run_sft(
        tiny_policy,
        WarmStartConfig(steps=5, batch_size=1, warmup_steps=1, max_seconds=1e-9),
        spec="5x5",
        seed=0,
        cell_px=32,
    )
    assert capped.steps_done == 1


def test_run_sft_tracks_first_moves_every_track_every_steps_and_after_the_last(
    tiny_policy: Policy,
) -> None:
    from maze_engine.decisions import first_move_rates

    calls: list[int] = []

    def track() -> dict[str, float]:
        calls.append(len(calls))
        return first_move_rates(tiny_policy, "tiny-64", cell_px=32, max_new_tokens=4)

    logged: list[dict[str, float]] = []
    report = run_sft(
        tiny_policy,
        WarmStartConfig(steps=5, batch_size=1, warmup_steps=1, track_every=2),
        spec="5x5",
        seed=0,
        cell_px=32,
        track=track,
        log=logged.append,
    )
    assert [row["step"] for row in report.first_moves] == [2, 4, 5]
    assert len(calls) == 3
    rates = report.first_moves[-1]
    # "all" is the mazes' mean, so it lies within the per-class rates.
    classes = [v for k, v in rates.items() if k not in ("step", "all")]
    assert classes and min(classes) <= rates["all"] <= max(classes)
    assert [row["step"] for row in logged if "first_move/all" in row] == [2, 4, 5]
    # track_every=0 turns tracking off.
    off = run_sft(
        tiny_policy,
        WarmStartConfig(steps=2, batch_size=1, warmup_steps=1, track_every=0),
        spec="5x5",
        seed=0,
        cell_px=32,
        track=track,
    )
    assert off.first_moves == [] and len(calls) == 3


def test_route_rehearsal_trains_route_questions_beside_unchanged_demonstrations(
    tiny_policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    from maze_engine import sft
    from maze_engine.errors import ConfigError
    from maze_policy.contexts import ROUTE_QUESTION

    seen: list[list[Trajectory]] = []
    step = sft.supervised_step

    def spy(policy: Policy, trajectories: list[Trajectory], *args: object, **kw: object) -> object:
        seen.append(list(trajectories))
        return step(policy, trajectories, *args, **kw)  # pyright: ignore[reportArgumentType]

    monkeypatch.setattr(sft, "supervised_step", spy)
    tok = tiny_policy.processor.tokenizer

    def asks_the_way(traj: Trajectory) -> bool:
        return ROUTE_QUESTION in tok.decode(traj.input_ids)

    def run(rehearsal: int) -> list[list[Trajectory]]:
        seen.clear()
        cfg = WarmStartConfig(steps=2, batch_size=1, warmup_steps=1, route_rehearsal=rehearsal)
        run_sft(tiny_policy, cfg, spec="5x5", seed=0, cell_px=32, context="latest")
        return [list(batch) for batch in seen]

    plain, rehearsed = run(0), run(3)
    assert len(plain) == len(rehearsed) == 2
    for demos, batch in zip(plain, rehearsed, strict=True):
        assert not any(asks_the_way(t) for t in demos)
        # The demonstrations are the same mazes with or without rehearsal, then 3 route questions.
        assert [t.input_ids for t in batch[: len(demos)]] == [t.input_ids for t in demos]
        extra = batch[len(demos) :]
        assert len(extra) == 3 and all(asks_the_way(t) for t in extra)
        assert all(t.num_generated > 0 for t in extra)
    # Fresh mazes every step: the two steps' questions differ.
    assert [t.input_ids for t in rehearsed[0][-3:]] != [t.input_ids for t in rehearsed[1][-3:]]
    with pytest.raises(ConfigError, match="route_rehearsal"):
        WarmStartConfig(route_rehearsal=-1).validate()


def test_a_grpo_steps_route_questions_come_from_its_seed_alone(
    tiny_policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    from maze_engine import perception
    from maze_engine.config import LocalConfig
    from maze_engine.errors import ConfigError
    from maze_engine.sft import route_rehearsal_batch
    from maze_env import MazeSpec
    from maze_policy.contexts import ROUTE_QUESTION

    drawn: list[str] = []
    draw_route = perception.draw_route

    def spy(*args: Any, **kwargs: Any) -> Any:
        frames = draw_route(*args, **kwargs)
        drawn.extend(m.layout_hash() for m in frames)
        return frames

    monkeypatch.setattr(perception, "draw_route", spy)

    def draw(seed: int, avoid: frozenset[str] = frozenset()) -> list[list[int]]:
        batch = route_rehearsal_batch(
            tiny_policy, 3, spec="5x5", seed=seed, cell_px=32, avoid=avoid
        )
        assert len(batch) == 3 and all(t.num_generated > 0 for t in batch)
        assert all(
            ROUTE_QUESTION in tiny_policy.processor.tokenizer.decode(t.input_ids) for t in batch
        )
        return [t.input_ids for t in batch]

    # No state between calls: a resumed run draws a step's questions again, token for token.
    assert draw(11) == draw(11) != draw(12)
    # A layout to avoid is never drawn: with all 5x5 layouts but one banned, every question
    # shows that one.
    spec = MazeSpec.parse("5x5")
    hashes = {generate(spec, s).layout_hash() for s in range(200)}
    assert len(hashes) > 1
    keep = generate(spec, 0).layout_hash()
    drawn.clear()
    draw(11, frozenset(hashes - {keep}))
    assert drawn == [keep] * 3
    with pytest.raises(ConfigError, match=r"local\.route_rehearsal"):
        LocalConfig(route_rehearsal=-1).validate()


def test_route_stop_share_asks_that_share_with_the_agent_on_the_goal_answered_stop(
    tiny_policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    from maze_engine import perception, sft
    from maze_engine.sft import route_rehearsal_batch

    tok = tiny_policy.processor.tokenizer
    shown: list[Any] = []
    example = perception.route_example

    def spy(policy: Policy, frames: Any, **kw: Any) -> Trajectory:
        shown.append(frames[0])
        return example(policy, frames, **kw)

    monkeypatch.setattr(perception, "route_example", spy)

    def replies(stop_share: float, count: int = 3) -> list[str]:
        shown.clear()
        batch = route_rehearsal_batch(
            tiny_policy, count, spec="7x7", seed=5, cell_px=32, avoid=(), stop_share=stop_share
        )
        return [
            tok.decode(t.input_ids[a:b], skip_special_tokens=True)
            for t in batch
            for a, b in t.generated_spans()
        ]

    stop = "<action>stop</action>"
    # At 0 the stream is the one drawn before the option existed: one route draw per question,
    # nothing else from the generator, so earlier runs repeat bit for bit.
    rng, seeds = sft._route_stream(5)  # pyright: ignore[reportPrivateUsage]
    banned = sft._rehearsal_banned(())  # pyright: ignore[reportPrivateUsage]
    before = [
        example(tiny_policy, perception.draw_route(rng, "7x7", seeds, banned, 1), cell_px=32)
        for _ in range(3)
    ]
    assert [
        t.input_ids
        for t in route_rehearsal_batch(
            tiny_policy, 3, spec="7x7", seed=5, cell_px=32, avoid=(), stop_share=0.0
        )
    ] == [t.input_ids for t in before]
    assert stop not in replies(0.0, 12)
    assert replies(1.0) == [stop] * 3 and all(m.start == m.goal for m in shown)
    mixed = replies(0.5, 24)
    assert 0 < mixed.count(stop) < 24
    # A stop exactly where the agent stands on the goal; a move everywhere else.
    assert [r == stop for r in mixed] == [m.start == m.goal for m in shown]
    # The warm start's rehearsal reads its own share.
    seen: list[list[Trajectory]] = []
    step = sft.supervised_step

    def record(
        policy: Policy, trajectories: list[Trajectory], *args: object, **kw: object
    ) -> object:
        seen.append(list(trajectories))
        return step(policy, trajectories, *args, **kw)  # pyright: ignore[reportArgumentType]

    monkeypatch.setattr(sft, "supervised_step", record)
    cfg = WarmStartConfig(
        steps=1, batch_size=1, warmup_steps=1, route_rehearsal=2, route_stop_share=1.0
    )
    run_sft(tiny_policy, cfg, spec="5x5", seed=0, cell_px=32, context="route")
    questions = seen[0][-2:]
    assert [
        tok.decode(t.input_ids[a:b], skip_special_tokens=True)
        for t in questions
        for a, b in t.generated_spans()
    ] == [stop] * 2


def test_decision_weight_counts_the_justification_and_action_tokens_that_many_times(
    tiny_policy: Policy,
) -> None:
    from maze_engine.sft import decision_positions

    maze = generate("5x5", 0)
    trajs = [oracle_episode(tiny_policy, maze)]
    batch = tiny_policy.collate(trajs)
    # The system prompt names the tags too; only the replies' tokens carry loss.
    decisions = decision_positions(tiny_policy, batch.input_ids) & batch.loss_mask.bool()
    # Two decision tokens per reply: the justification and the action word.
    assert int(decisions.sum()) == 2 * (maze.optimal_moves + 1)
    tok = tiny_policy.processor.tokenizer
    words = {tok.decode([int(i)]) for i in batch.input_ids[decisions]}
    assert {d.word for d in maze.optimal_actions} | {"stop"} <= words
    with torch.no_grad():
        lp = sequence_logprobs(tiny_policy.model, batch, suppress_ids=tiny_policy.suppress_ids)
        plain = float(sft_loss(tiny_policy, trajs))
        weighted = float(sft_loss(tiny_policy, trajs, decision_weight=5.0))
    mask = batch.loss_mask
    assert plain == pytest.approx(float(-(lp * mask).sum() / mask.sum()), rel=1e-5)
    w = mask * (1 + 4 * decisions.float())
    assert weighted == pytest.approx(float(-(lp * w).sum() / w.sum()), rel=1e-5)
    assert abs(weighted - plain) > 1e-4  # the weighting is applied, not a no-op
