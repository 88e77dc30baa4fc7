"""Perception pretraining, decision replays, held-out checks and shipped artifacts."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from pathlib import Path

import pytest

from maze_engine import artifacts
from maze_engine.config import PerceptionConfig, load_config
from maze_engine.data import check_held_out, overlapping_layouts
from maze_engine.decisions import (
    distances,
    good_turns,
    layout_class,
    replay,
    summarize,
    turn_rewards,
)
from maze_engine.errors import ConfigError
from maze_engine.perception import (
    _char_ids,  # pyright: ignore[reportPrivateUsage]
    _draw,  # pyright: ignore[reportPrivateUsage]
    draw_route,
    held_out_layouts,
    on_goal,
    reading_accuracy,
    route_accuracy,
    route_example,
    route_reply,
    route_states,
    run_perception,
    transcription,
)
from maze_env import Direction, Maze, generate, get_eval_set
from maze_env.agents import moved, open_ways
from maze_env.export import build_rows
from maze_env.maze import Pos
from maze_env.prompts import oracle_reply
from maze_policy.chat import Trajectory
from maze_policy.policy import Policy


def _oracle_replies(maze_spec: str, seed: int) -> tuple[Maze, list[str]]:
    maze = generate(maze_spec, seed)
    pos = maze.start
    replies: list[str] = []
    for d in maze.optimal_actions:
        replies.append(oracle_reply(pos, maze.goal, d.word))
        dr, dc = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}[d.word]
        pos = (pos[0] + dr, pos[1] + dc)
    replies.append(oracle_reply(pos, maze.goal, "stop"))
    return maze, replies


def test_replay_of_the_oracle_is_all_good_decisions() -> None:
    maze, replies = _oracle_replies("7x7", 3)
    out = replay(maze, replies, 20)
    assert out.solved and out.first_move_good and out.stopped_on_arrival
    assert out.bumps == 0 and out.reached_goal
    forks = sum(fork for m, fork in route_states("small-64") if m.seed == 4)
    maze4, replies4 = _oracle_replies("7x7", 4)
    route4 = replay(maze4, replies4, 20)
    assert forks == 3 and route4.forks == forks == route4.forks_good  # seed 4: start + two forks


def test_a_wrong_turn_at_a_fork_is_a_bad_fork_decision() -> None:
    maze = generate("7x7", 4)  # forks at the start and two squares on its route
    dist = distances(maze)
    start_ways = [d for d in Direction if maze.is_open(moved(maze.start, d))]
    wrong = next(d for d in start_ways if dist[moved(maze.start, d)] > dist[maze.start])
    out = replay(maze, [f"<action>{wrong.word}</action>"], 20)
    assert out.forks == 1 and out.forks_good == 0 and out.first_move_good is False


def test_replay_counts_a_bump_and_its_recovery_and_a_missed_stop() -> None:
    maze, replies = _oracle_replies("7x7", 3)
    m = maze
    dist = distances(m)
    r, c = m.start
    walled = next(
        w
        for w, (dr, dc) in {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}.items()
        if (r + dr, c + dc) not in dist
    )
    bumped = [f"<action>{walled}</action>", *replies[:-1], "<action>up</action>"]
    out = replay(m, bumped, 20)
    assert out.first_move_good is False and out.bumps >= 1 and out.recoveries == 1
    assert out.reached_goal and out.stopped_on_arrival is False and not out.solved
    rates = summarize([out, replay(m, replies, 20)])
    assert rates["all"]["first_move_good"] == 0.5 and rates["all"]["episodes"] == 2
    assert layout_class(m) in rates


def _walled_way(maze: Maze, pos: Pos) -> str:
    """A move from ``pos`` into a wall: the reply that bumps there."""
    return next(d.word for d in Direction if d not in open_ways(maze, pos))


def test_good_turns_judge_each_played_turn_by_the_route() -> None:
    maze, replies = _oracle_replies("7x7", 3)
    assert good_turns(maze, replies, 20) == [True] * len(replies)
    walled = _walled_way(maze, maze.start)
    # A bump, an unreadable reply and a stop off the goal are bad; the oracle's moves stay good;
    # arriving without stopping, then moving off the goal, is a bad last turn.
    played = [f"<action>{walled}</action>", "no action", *replies[:-1], "<action>up</action>"]
    verdicts = good_turns(maze, played, 30)
    assert verdicts[:2] == [False, False] and all(verdicts[2:-1]) and verdicts[-1] is False
    assert good_turns(maze, [replies[-1]], 20) == [False]  # stop on the start square
    # Turns after the budget ran out were never played.
    assert len(good_turns(maze, ["no action"] * 5, 3)) == 3


def test_turn_rewards_score_a_stop_off_the_goal_below_a_bump() -> None:
    maze, replies = _oracle_replies("7x7", 3)
    # The bump is played after the first (oracle) move.
    walled = _walled_way(maze, moved(maze.start, maze.optimal_actions[0]))
    off_goal = [replies[0], f"<action>{walled}</action>", "<action>stop</action>"]
    played = replay(maze, off_goal, 20)
    assert played.stopped_off_goal and not replay(maze, replies, 20).stopped_off_goal
    # A good move, then a bump (0 either way), then the stop away from the goal.
    assert turn_rewards(maze, off_goal, 20) == [1.0, 0.0, 0.0]
    assert turn_rewards(maze, off_goal, 20, off_goal_stop_penalty=0.5) == [1.0, 0.0, -0.5]
    # The stop on the goal stays a good turn, whatever the penalty.
    assert turn_rewards(maze, replies, 20, off_goal_stop_penalty=0.5) == [1.0] * len(replies)
    # Turns never played (the stop ended the episode) get no reward.
    assert len(turn_rewards(maze, [*off_goal, replies[1]], 20, off_goal_stop_penalty=1)) == 3


def test_a_first_reply_that_is_no_move_counts_as_a_bad_first_move() -> None:
    """One meaning of the rate everywhere (eval summaries, the probe, warm-start tracking)."""
    from maze_engine.decisions import first_move_good

    maze, replies = _oracle_replies("7x7", 3)
    invalid = replay(maze, ["no action here", *replies], 20)
    stopped = replay(maze, [replies[-1]], 20)
    assert invalid.first_move_good is None and stopped.first_move_good is None
    good = replay(maze, replies, 20)
    assert summarize([invalid, stopped, good])["all"]["first_move_good"] == 1 / 3
    assert first_move_good([True, None, False, None]) == 0.25
    assert first_move_good([]) is None


def test_the_decisions_report_compares_the_first_and_last_evaluation(tmp_path: Path) -> None:
    import json

    from maze_engine.decisions import EVALS_DIR, write_decisions_report

    assert write_decisions_report(tmp_path) is None  # no evaluations recorded
    evals = tmp_path / EVALS_DIR
    evals.mkdir()

    def record(step: int, oracle: bool) -> None:
        lines: list[str] = []
        for seed in (3, 4):
            _maze, replies = _oracle_replies("7x7", seed)
            played = replies if oracle else ["<action>stop</action>"]
            lines.append(
                json.dumps(
                    {
                        "preset": "7x7",
                        "seed": seed,
                        "step_budget": 20,
                        "replies": played,
                        "solved": oracle,
                    }
                )
            )
        (evals / f"step_{step}.jsonl").write_text("\n".join(lines) + "\n")

    record(0, oracle=False)
    assert write_decisions_report(tmp_path) is None  # one evaluation: nothing to compare
    record(20, oracle=True)
    record(10, oracle=False)  # the middle one is not compared: steps are ordered numerically
    out = write_decisions_report(tmp_path)
    assert out is not None and out == tmp_path / "decisions.md"
    text = out.read_text()
    assert text.startswith("# Decisions: global step 0 -> 20")
    assert "| all | 2 | 0% -> 100% | 0% -> 100% | 0% -> 100% | - -> 100% | - -> - |" in text


def test_transcription_marks_agent_goal_and_walls() -> None:
    maze = generate("5x5", 1)
    text = transcription(maze, maze.start).split("\n")
    assert len(text) == 5 and all(len(row) == 5 for row in text)
    assert text[maze.goal[0]][maze.goal[1]] == "G" and text[maze.start[0]][maze.start[1]] == "A"
    assert text[0] == "#####"


def test_pretraining_never_draws_a_held_out_layout() -> None:
    banned = held_out_layouts()
    assert len(banned) >= 54  # small-64 alone has 54 distinct layouts
    cfg = PerceptionConfig(specs=["7x7"])
    rng = random.Random(0)
    seeds = itertools.count(0)  # eval-set seeds first: the ban must skip them
    for _ in range(40):
        maze, agent = _draw(cfg, rng, seeds, banned)
        assert maze.layout_hash() not in banned and maze.is_open(agent)
        frames = draw_route(rng, "7x7", seeds, banned, 4)
        assert 1 <= len(frames) <= 4 and len({f.layout_hash() for f in frames}) == 1
        for f in frames:
            assert f.layout_hash() not in banned and f.start != f.goal == frames[0].goal
            assert f.is_open(f.start) and f.is_open(f.goal)
        for a, b in itertools.pairwise(frames):  # the agent walks one square or bumps
            assert abs(a.start[0] - b.start[0]) + abs(a.start[1] - b.start[1]) <= 1


def test_a_few_perception_steps_lower_the_loss(tiny_policy: Policy) -> None:
    assert len(set(_char_ids(tiny_policy).values())) == 5
    cfg = PerceptionConfig(
        steps=6, batch_size=2, lr=1e-2, warmup_steps=1, specs=["5x5"], eval_every=6, eval_mazes=2
    )
    report = run_perception(tiny_policy, cfg)
    assert report.steps_done == 6 and report.losses[-1] < report.losses[0]
    reading = reading_accuracy(tiny_policy, [(generate("5x5", 0), (1, 1))], cell_px=32)
    assert all(0.0 <= v <= 1.0 for v in reading.values())
    assert set(report.evals[-1]) >= {"5x5/passage_accuracy", "5x5/neighbour_accuracy"}


def test_route_examples_answer_the_first_move_of_a_shortest_route(tiny_policy: Policy) -> None:
    from maze_env.agents import moved

    states = route_states("small-64")
    assert len(states) == sum(m.optimal_moves for m in get_eval_set("small-64").mazes)
    assert 0 < sum(fork for _m, fork in states) < len(states)
    route = [m for m, _fork in states if m.seed == states[0][0].seed]
    traj = route_example(tiny_policy, route, cell_px=32)  # one frame per square of its route
    tok = tiny_policy.processor.tokenizer
    spans = traj.generated_spans()
    assert len(spans) == len(route) == len(traj.images)
    for maze, (a, b) in zip(route, spans, strict=True):
        reply = tok.decode(traj.input_ids[a:b], skip_special_tokens=True)
        word = reply.removeprefix("<action>").removesuffix("</action>")
        step = moved(maze.start, Direction[word.upper()])
        assert distances(maze)[step] == distances(maze)[maze.start] - 1
    # On the goal the way is to stop, and the frame shows the agent there.
    goal = on_goal(route[0])
    assert goal.start == goal.goal == route[0].goal and goal.walls is route[0].walls
    assert goal.seed == route[0].seed is not None and goal.spec == route[0].spec
    assert route_reply(goal) == "<action>stop</action>" != route_reply(route[0])
    cfg = PerceptionConfig(
        steps=6,
        batch_size=2,
        lr=1e-2,
        warmup_steps=1,
        route_share=1.0,
        route_frames=3,
        eval_every=0,
    )
    report = run_perception(tiny_policy, cfg)
    assert report.steps_done == 6 and report.losses[-1] < report.losses[0]
    for walked in (False, True):
        acc = route_accuracy(tiny_policy, "tiny-64", cell_px=32, walked=walked)
        assert set(acc) == {"route_squares", "route_forks", "route_mazes"}
        assert all(0.0 <= v <= 1.0 for v in acc.values())


def test_pretraining_stop_share_ends_that_share_of_route_examples_on_the_goal(
    tiny_policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    from maze_engine import perception

    shown: list[list[Maze]] = []
    example = perception.route_example

    def spy(policy: Policy, frames: list[Maze], **kw: int) -> Trajectory:
        shown.append(list(frames))
        return example(policy, frames, **kw)

    monkeypatch.setattr(perception, "route_example", spy)
    cfg = PerceptionConfig(
        steps=2,
        batch_size=3,
        lr=1e-3,
        warmup_steps=1,
        eval_every=0,
        route_share=1.0,
        route_frames=3,
    )
    run_perception(tiny_policy, cfg)
    assert len(shown) == 6 and not any(f.start == f.goal for ex in shown for f in ex)
    shown.clear()
    checked = replace(
        cfg,
        route_stop_share=1.0,
        eval_every=2,
        specs=["5x5"],
        eval_mazes=1,
        route_eval_set="tiny-64",
    )
    report = run_perception(tiny_policy, checked)
    # The checks' reading of the stop lands in the report (and so in a base's recipe).
    assert {"tiny-64/goal_stops", "tiny-64/route_stops", "tiny-64/route_mazes"} <= set(
        report.evals[-1]
    )
    shown = [frames for frames in shown if frames[0].shape == (7, 7)]  # not the 5x5 checks
    assert len(shown) == 6
    for frames in shown:
        # The agent stands on the goal in the last frame only, where its walk would have ended.
        assert route_reply(frames[-1]) == "<action>stop</action>"
        assert frames[-1].start == frames[-1].goal and frames[-1].walls is frames[0].walls
        assert all(f.start != f.goal for f in frames[:-1])


def test_stop_reading_counts_where_stop_is_the_likeliest_word(tiny_policy: Policy) -> None:
    import torch

    from maze_engine.perception import stop_reading

    tok = tiny_policy.processor.tokenizer
    stop_id = tok.encode("<action>stop</action>", add_special_tokens=False)[1]
    inner = tiny_policy.model

    class Leaning(torch.nn.Module):
        """The tiny model with ``bias`` added to the stop word's logit everywhere."""

        def __init__(self, bias: float) -> None:
            super().__init__()
            self.inner, self.bias = inner, bias

        def forward(self, **kw: object) -> object:
            out = self.inner(**kw)
            out.logits[..., stop_id] += self.bias
            return out

    for bias, share in ((1e4, 1.0), (-1e4, 0.0)):
        tiny_policy.model = Leaning(bias)
        assert stop_reading(tiny_policy, "tiny-64", cell_px=32) == {
            "goal_stops": share,
            "route_stops": share,
        }


def test_training_rows_that_repeat_eval_layouts_fail_the_run() -> None:
    es = get_eval_set("tiny-64")
    train = build_rows(es.spec, [1_000_000, 1_000_001], split="train")
    val = build_rows(es.spec, es.seeds, split="validation")
    assert overlapping_layouts(train, val) == 2  # 5x5 has 16 layouts, all in tiny-64
    strict = load_config("smoke_5x5", ["mazes.allow_eval_overlap=false"])
    with pytest.raises(ConfigError, match=r"mazes\.allow_eval_overlap.*2 training rows"):
        check_held_out(strict, train, val)
    check_held_out(load_config("smoke_5x5"), train, val)  # allowed there


def test_a_changed_artifact_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from weight_sync import fs

    art = tmp_path / "tiny-x"
    art.mkdir()
    (art / "model.safetensors").write_bytes(b"weights")
    fs.write_manifest(art)
    monkeypatch.setattr(artifacts, "ARTIFACTS_DIR", tmp_path)
    assert artifacts.artifact_path("tiny-x") == art
    (art / "model.safetensors").write_bytes(b"Weights")
    with pytest.raises(artifacts.ArtifactError, match="does not match its manifest"):
        artifacts.artifact_path("tiny-x")
    with pytest.raises(artifacts.ArtifactError, match="no shipped artifact 'nope'"):
        artifacts.artifact_path("nope")


def test_the_held_out_config_trains_on_no_eval_layout_and_its_base_verifies(
    tmp_path: Path,
) -> None:
    from maze_engine.data import export_datasets, read_rows

    config = load_config("tiny_local", [f"trainer.export_path={tmp_path}"])
    export_datasets(config)
    train = read_rows(config.skyrl.data.train_data)
    val = read_rows(config.skyrl.data.val_data)
    assert len(train) == 256 and overlapping_layouts(train, val) == 0
    check_held_out(config, train, val)
    assert artifacts.artifact_path(config.local.tiny_base).is_dir()
    # The warm start skips the report sets' layouts as well as the eval set's.
    from maze_engine.trainer import held_out_hashes

    held = held_out_hashes(config)
    for name in (config.mazes.eval_set, *config.mazes.report_sets):
        assert {m.layout_hash() for m in get_eval_set(name).mazes} <= held, name
    assert config.mazes.report_sets == ["easy-64"]
    overlap = load_config("tiny_local", ["mazes.allow_eval_overlap=true"])
    assert held_out_hashes(overlap) == frozenset()


@pytest.mark.parametrize(
    ("name", "init", "forks"),
    [
        ("tiny-qwen3vl-route", "tiny-qwen3vl-perception", 0.9),
        ("tiny-qwen3vl-route-v2", "tiny-qwen3vl-route", 0.95),
    ],
)
def test_the_route_bases_record_their_recipe_and_the_base_they_started_from(
    name: str, init: str, forks: float
) -> None:
    import json

    route = artifacts.artifact_path(name)
    recipe = json.loads((route / "recipe.json").read_text())
    manifest = json.loads((artifacts.artifact_path(init) / "manifest.json").read_text())
    assert recipe["init"] == init
    assert recipe["init_weights_sha256"] == manifest["files"]["model.safetensors"]["sha256"]
    assert recipe["command"].startswith("maze-train pretrain ")
    settings = recipe["perception"]
    assert settings["route_share"] > 0 and recipe["steps_done"] == settings["steps"]
    assert {"small-64", "easy-64"} <= set(recipe["held_out_sets"])
    # What it measured on held-out routes is recorded with it (a route square is asked alone).
    assert recipe["reading"]["small-64/route_forks"] > forks
