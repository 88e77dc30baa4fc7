"""Perception pretraining: teach a tiny VLM to read a rendered maze before any task tuning.

Real VLMs are aligned on dense image descriptions before instruction tuning; a tiny model built
from a config has seen nothing. Here it learns two descriptions of rendered mazes:

* a transcription, square by square (``#`` wall, ``.`` open, ``A`` agent, ``G`` goal, one row
  per line), one existing single-byte token per square, so every square of the image is tied
  to one supervised token;
* the way to the goal (``route_share`` of the examples): the first move of a shortest route
  from the agent to the goal, answered as an action tag. Agent and goal stand on random
  squares (the goal on a corner cell half the time), so the answer is read off the walls
  between them, not off a route remembered per corner. One example asks it of up to
  ``route_frames`` frames in a row, the agent walking at random between them: a conversation of
  images, as an episode is, each to be read on its own wherever it stands in the context (a
  model taught on single images reads a later frame far worse).
  With ``route_stop_share``, that share of them ends on a frame with the agent on the goal,
  answered ``stop``: without it the base never sees the frame an episode must stop on.

The mazes are fresh every step, and no layout of a held-out eval set is ever drawn
(:func:`held_out_layouts`), so the model must read walls and the agent from the image, not
from memorised layouts. Training mazes are drawn far from the eval sets' seeds (maze-env's
``TRAIN_SEED_OFFSET``).
"""

from __future__ import annotations

import itertools
import math
import random
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from maze_engine.config import MazerlConfig, PerceptionConfig
from maze_engine.sft import supervised_step
from maze_policy.contexts import ROUTE_QUESTION

if TYPE_CHECKING:
    from maze_env import Maze
    from maze_policy.chat import Trajectory
    from maze_policy.policy import Policy

PROMPT = "Transcribe the maze row by row: # wall, . open, A agent, G goal."
SEED_STRIDE = 7_919
"""Distance between the maze seeds of two pretraining seeds' streams (prime, so they rarely meet)."""


@dataclass
class PerceptionReport:
    """What a perception run did: its config, losses and reading accuracy over time."""

    config: dict[str, Any]
    losses: list[float] = field(default_factory=list[float])
    evals: list[dict[str, float]] = field(default_factory=list[dict[str, float]])
    steps_done: int = 0
    seconds: float = 0.0


def transcription(maze: Maze, agent: tuple[int, int]) -> str:
    """The reply the model learns: ``#``/``.`` per square, ``A`` agent, ``G`` goal, rows by line."""
    rows = [list(r) for r in maze.grid_rows()]
    gr, gc = maze.goal
    rows[gr][gc] = "G"
    ar, ac = agent
    rows[ar][ac] = "A"
    return "\n".join("".join(r) for r in rows)


def _char_ids(policy: Policy) -> dict[str, int]:
    """One single-byte token per character; byte-level BPE has one for every byte."""
    tok = policy.processor.tokenizer
    out: dict[str, int] = {}
    for ch in "#.AG\n":
        ids = tok.encode(ch, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"the tokenizer has no single token for {ch!r}")
        out[ch] = int(ids[0])
    return out


def perception_example(
    policy: Policy, maze: Maze, agent: tuple[int, int], *, cell_px: int, ids: dict[str, int]
) -> Trajectory:
    """The image + prompt as a user turn, and the transcription as the supervised reply."""
    from maze_env.prompts import image_part, text_part
    from maze_env.render import Renderer, Style

    uri = Renderer(maze, Style(cell_px=cell_px)).data_uri(agent)
    enc = policy.encoder
    traj = enc.start([{"role": "user", "content": [image_part(uri), text_part(PROMPT)]}])
    reply = [ids[ch] for ch in transcription(maze, agent)]
    enc.add_assistant(traj, [*reply, enc.eos_token_id])
    return traj


HELD_OUT_SETS = ("small-64", "easy-64", "hard-64")
"""Eval sets whose layouts pretraining never shows (tiny-64 holds all 16 5x5 layouts, so no
5x5 maze could be drawn: it is not a held-out set)."""


def held_out_layouts() -> set[str]:
    """``Maze.layout_hash`` of every held-out eval maze: pretraining never shows these walls."""
    from maze_env import get_eval_set

    return {m.layout_hash() for name in HELD_OUT_SETS for m in get_eval_set(name).mazes}


def _fresh_maze(spec: str, seeds: Iterator[int], banned: set[str]) -> Maze:
    from maze_env import generate

    maze = generate(spec, next(seeds))
    while maze.layout_hash() in banned:
        maze = generate(spec, next(seeds))
    return maze


def _open_squares(maze: Maze, *, but: tuple[int, int] | None = None) -> list[tuple[int, int]]:
    rows, cols = maze.shape
    return [
        (r, c) for r in range(rows) for c in range(cols) if maze.is_open((r, c)) and (r, c) != but
    ]


def _draw(
    cfg: PerceptionConfig, rng: random.Random, seeds: Iterator[int], banned: set[str]
) -> tuple[Maze, tuple[int, int]]:
    maze = _fresh_maze(rng.choice(cfg.specs), seeds, banned)
    agent = maze.start
    if rng.random() < cfg.random_agent:
        agent = rng.choice(_open_squares(maze, but=maze.goal))
    return maze, agent


def draw_route(
    rng: random.Random, spec: str, seeds: Iterator[int], banned: set[str], frames: int
) -> list[Maze]:
    """Frames of one fresh maze to ask the way on: ``Maze`` copies whose start is the agent.

    The goal is on a random cell (a corner cell half the time, as in the eval sets); the agent
    starts on a random open square and walks at random (a step to an open neighbour, or a bump
    that leaves it in place), so later frames show it where an episode would take it.
    """
    from maze_env import Maze
    from maze_env.agents import moved, open_ways

    maze = _fresh_maze(spec, seeds, banned)
    rows, cols = maze.shape
    cells = [(r, c) for r in range(1, rows - 1, 2) for c in range(1, cols - 1, 2)]
    corners = [(1, 1), (1, cols - 2), (rows - 2, 1), (rows - 2, cols - 2)]
    goal = rng.choice(corners if rng.random() < 0.5 else cells)
    agent = rng.choice(_open_squares(maze, but=goal))
    out: list[Maze] = []
    for _ in range(rng.randint(1, frames)):
        out.append(Maze(walls=maze.walls, start=agent, goal=goal, spec=maze.spec))
        ways = [d for d in open_ways(maze, agent) if moved(agent, d) != goal]
        if ways and rng.random() < 0.9:
            agent = moved(agent, rng.choice(ways))
    return out


def route_reply(maze: Maze) -> str:
    """The way to the goal from ``maze.start``, as an action tag.

    That is its shortest route's first move, or ``stop`` when the agent stands on the goal.
    """
    from maze_env.prompts import action_reply

    if maze.start == maze.goal:
        return action_reply("stop")
    return action_reply(maze.optimal_actions[0].word)


def on_goal(maze: Maze) -> Maze:
    """``maze`` with its agent standing on the goal: the frame whose route answer is ``stop``."""
    return replace(maze, start=maze.goal)


def route_example(policy: Policy, frames: Sequence[Maze], *, cell_px: int) -> Trajectory:
    """One conversation asking the way on each frame in turn, every answer supervised.

    A frame is shown with its agent at the frame's ``start``.
    """
    from maze_env.prompts import image_part, text_part
    from maze_env.render import Renderer, Style

    if not frames:
        raise ValueError("a route example needs at least one frame")
    renderer = Renderer(frames[0], Style(cell_px=cell_px))
    enc = policy.encoder
    traj: Trajectory | None = None
    for frame in frames:
        ask = {
            "role": "user",
            "content": [image_part(renderer.data_uri(frame.start)), text_part(ROUTE_QUESTION)],
        }
        if traj is None:
            traj = enc.start([ask])
        else:
            enc.add_user(traj, ask)
        enc.add_assistant_text(traj, route_reply(frame))
    assert traj is not None
    return traj


def route_states(eval_set: str) -> list[tuple[Maze, bool]]:
    """Each eval maze's route squares (goal excluded) as mazes starting there, and if a fork.

    A fork has more than one way on (at the start: more than one open way).
    """
    from maze_env import Maze, get_eval_set
    from maze_env.agents import open_ways

    out: list[tuple[Maze, bool]] = []
    for m in get_eval_set(eval_set).mazes:
        for i, pos in enumerate(m.shortest_path[:-1]):
            ways_on = len(open_ways(m, pos)) - (1 if i else 0)
            out.append(
                (
                    Maze(walls=m.walls, start=pos, goal=m.goal, spec=m.spec, seed=m.seed),
                    ways_on >= 2,
                )
            )
    return out


def _word_ids(policy: Policy, words: Sequence[str]) -> list[int]:
    """The token of each word inside its action tag (``<action>``, word, ``</action>``)."""
    from maze_env.prompts import action_reply

    tok = policy.processor.tokenizer
    out: list[int] = []
    for word in words:
        ids = tok.encode(action_reply(word), add_special_tokens=False)
        if len(ids) != 3 or ids[1:2] != tok.encode(word, add_special_tokens=False):
            raise ValueError(
                f"the tokenizer does not write {action_reply(word)!r} as tag, word, tag"
            )
        out.append(int(ids[1]))
    return out


def _move_ids(policy: Policy) -> list[int]:
    """The token of each move word inside its action tag."""
    from maze_env import Direction

    return _word_ids(policy, [d.word for d in Direction])


def _likeliest_words(
    policy: Policy, conversations: Sequence[Sequence[Maze]], words: list[int], *, cell_px: int
) -> list[tuple[int, int]]:
    """Teacher-forced ``(likeliest, said)`` for each reply of each route conversation, in order.

    ``likeliest`` is the likeliest of ``words`` (token ids) where the reply's word stands;
    ``said`` is the reply's own word.
    """
    ids = torch.tensor(words)
    out: list[tuple[int, int]] = []
    for lo in range(0, len(conversations), 32):
        trajs = [route_example(policy, c, cell_px=cell_px) for c in conversations[lo : lo + 32]]
        batch = policy.collate(trajs)
        with torch.no_grad():
            logits = policy.model(**batch.model_inputs(), use_cache=False).logits
        for row, traj in enumerate(trajs):
            # Each reply opens with the tag; the tag's position predicts the word.
            for tag, _end in traj.generated_spans():
                out.append((int(ids[logits[row, tag, ids].argmax()]), traj.input_ids[tag + 1]))
    return out


def route_accuracy(
    policy: Policy, eval_set: str, *, cell_px: int, walked: bool = False
) -> dict[str, float]:
    """Teacher-forced: is the model's likeliest move word the route's, on ``eval_set``'s routes?

    Each square of a shortest route is asked alone (``walked`` False), or every maze is one
    conversation of its route's frames in order, as an oracle's episode shows them
    (``walked``: each frame read after the ones before it). ``route_squares``: every square of
    every route; ``route_forks``: the squares with more than one way on (the decisions that
    need planning); ``route_mazes``: mazes whose whole route is answered right.
    """
    states = route_states(eval_set)
    if walked:
        by_maze: dict[int | None, list[Maze]] = {}
        for m, _fork in states:
            by_maze.setdefault(m.seed, []).append(m)
        conversations = list(by_maze.values())
    else:
        conversations = [[m] for m, _fork in states]
    picked = _likeliest_words(policy, conversations, _move_ids(policy), cell_px=cell_px)
    hits = [best == said for best, said in picked]
    forks = [h for h, (_m, fork) in zip(hits, states, strict=True) if fork]
    per_maze: dict[int | None, bool] = {}
    for h, (m, _fork) in zip(hits, states, strict=True):
        per_maze[m.seed] = per_maze.get(m.seed, True) and h
    return {
        "route_squares": sum(hits) / len(hits),
        "route_forks": sum(forks) / max(1, len(forks)),
        "route_mazes": sum(per_maze.values()) / len(per_maze),
    }


def stop_reading(policy: Policy, eval_set: str, *, cell_px: int) -> dict[str, float]:
    """Teacher-forced: where does the model's likeliest word, among ``stop`` and the moves, stop?

    ``goal_stops``: the share of ``eval_set``'s mazes where, with the agent on the goal, it is
    ``stop`` (an episode must stop there); ``route_stops``: the share of their route squares
    (goal excluded) where it is ``stop``, each asked alone (an episode that stops there fails).
    """
    from maze_env import get_eval_set

    stop = _word_ids(policy, ["stop"])[0]
    route = [m for m, _fork in route_states(eval_set)]
    goals = [on_goal(m) for m in get_eval_set(eval_set).mazes]
    frames = [[f] for f in (*goals, *route)]
    words = [stop, *_move_ids(policy)]
    stops = [
        best == stop for best, _said in _likeliest_words(policy, frames, words, cell_px=cell_px)
    ]
    return {
        "goal_stops": sum(stops[: len(goals)]) / len(goals),
        "route_stops": sum(stops[len(goals) :]) / len(route),
    }


def _square_hits(
    policy: Policy, mazes: Sequence[tuple[Maze, tuple[int, int]]], *, cell_px: int
) -> list[list[bool]]:
    """Per maze, teacher-forced: was each square's token the model's argmax? (row-major)."""
    ids = _char_ids(policy)
    trajs = [perception_example(policy, m, a, cell_px=cell_px, ids=ids) for m, a in mazes]
    batch = policy.collate(trajs)
    with torch.no_grad():
        logits = policy.model(**batch.model_inputs(), use_cache=False).logits[:, :-1]
    if policy.suppress_ids:
        logits = logits.index_fill(-1, torch.tensor(policy.suppress_ids), float("-inf"))
    hits = logits.argmax(-1) == batch.input_ids[:, 1:]
    mask = batch.loss_mask[:, 1:].bool()
    out: list[list[bool]] = []
    for row, (maze, _agent) in enumerate(mazes):
        got = [bool(h) for h in hits[row][mask[row]].tolist()]
        cols = maze.shape[1]
        # Drop the newline after each row: one entry per square.
        out.append(
            [got[k] for k in range(len(got)) if (k + 1) % (cols + 1) != 0][: maze.walls.size]
        )
    return out


def reading_accuracy(
    policy: Policy, mazes: Sequence[tuple[Maze, tuple[int, int]]], *, cell_px: int
) -> dict[str, float]:
    """Teacher-forced reading: the share of squares read right, by kind.

    Kinds: every square, passage squares, the squares next to the agent, whole grids. A passage square lies between two cells (one even and one odd coordinate, inside the outer
    wall): the squares that decide the route.
    """
    counts: dict[str, int] = dict.fromkeys(("squares", "passages", "neighbours"), 0)
    right: dict[str, int] = dict.fromkeys(counts, 0)
    grids_ok = 0
    for (maze, agent), hits in zip(
        mazes, _square_hits(policy, mazes, cell_px=cell_px), strict=True
    ):
        rows, cols = maze.shape
        near = {(agent[0] + dr, agent[1] + dc) for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1))}
        for k, ok in enumerate(hits):
            r, c = divmod(k, cols)
            kinds = ["squares"]
            if 0 < r < rows - 1 and 0 < c < cols - 1 and (r % 2) != (c % 2):
                kinds.append("passages")
            if (r, c) in near:
                kinds.append("neighbours")
            for kind in kinds:
                counts[kind] += 1
                right[kind] += ok
        grids_ok += all(hits)
    return {
        "square_accuracy": right["squares"] / max(1, counts["squares"]),
        "passage_accuracy": right["passages"] / max(1, counts["passages"]),
        "neighbour_accuracy": right["neighbours"] / max(1, counts["neighbours"]),
        "grid_exact": grids_ok / max(1, len(mazes)),
    }


def probe(
    policy: Policy, eval_set: str, *, cell_px: int, max_new_tokens: int = 32
) -> dict[str, Any]:
    """Perception, measured directly, per layout class of ``eval_set``'s mazes.

    ``first_move_good`` (:func:`~maze_engine.decisions.first_move_good`): the greedy first
    reply moves along a shortest path (the walls read right). ``neighbour_accuracy``: the
    squares next to the agent read right in the transcription task.
    """
    from maze_engine.decisions import distances, first_move_good, first_moves, layout_class
    from maze_env import get_eval_set

    es = get_eval_set(eval_set)
    firsts = first_moves(policy, eval_set, cell_px=cell_px, max_new_tokens=max_new_tokens)
    reads = _square_hits(policy, [(m, m.start) for m in es.mazes], cell_px=cell_px)
    by_class: dict[str, list[tuple[bool | None, float]]] = {}
    for maze, first, hits in zip(es.mazes, firsts, reads, strict=True):
        cols = maze.shape[1]
        near = [
            hits[r * cols + c]
            for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1))
            if 0 <= (r := maze.start[0] + dr) < maze.shape[0]
            and 0 <= (c := maze.start[1] + dc) < cols
        ]
        by_class.setdefault(layout_class(maze, distances(maze)), []).append(
            (first, sum(near) / len(near))
        )
    out: dict[str, Any] = {}
    for key, items in sorted(by_class.items()):
        out[key] = {
            "mazes": len(items),
            "first_move_good": first_move_good(f for f, _ in items),
            "neighbour_accuracy": sum(n for _, n in items) / len(items),
        }
    return out


def _lr_lambda(cfg: PerceptionConfig) -> Callable[[int], float]:
    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    return f


def eval_mazes(cfg: PerceptionConfig, spec: str) -> list[tuple[Maze, tuple[int, int]]]:
    """Fixed held-out mazes for the reading checks (eval-set seeds 0.., never trained on)."""
    from maze_env import generate

    return [(m, m.start) for m in (generate(spec, s) for s in range(cfg.eval_mazes))]


def run_perception(
    policy: Policy,
    cfg: PerceptionConfig,
    *,
    log: Callable[[dict[str, float]], None] | None = None,
    snapshot: Callable[[int], None] | None = None,
) -> PerceptionReport:
    """Train ``policy.model`` (all weights) in place on the transcription and route tasks.

    ``snapshot(step)`` runs every ``cfg.snapshot_every`` steps (e.g. to save the model midway).
    """
    from maze_env.export import TRAIN_SEED_OFFSET

    model = policy.model
    report = PerceptionReport(config=asdict(cfg))
    if cfg.freeze_patch_embed:
        for name, p in model.named_parameters():
            if "patch_embed" in name:
                p.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg))
    ids = _char_ids(policy)
    rng = random.Random(cfg.seed)
    seeds = itertools.count(TRAIN_SEED_OFFSET + 2_000_000 + cfg.seed * SEED_STRIDE * 1_000)
    banned = held_out_layouts()
    checks = {spec: eval_mazes(cfg, spec) for spec in sorted(set(cfg.specs))}
    t_start = time.perf_counter()
    for step in range(cfg.steps):
        if cfg.max_seconds is not None and time.perf_counter() - t_start >= cfg.max_seconds:
            break
        trajs: list[Trajectory] = []
        for _ in range(cfg.batch_size):
            # No draw for the task when there is one task: the transcription-only recipe's
            # random stream (and so its artifact) stays what it was.
            if cfg.route_share and rng.random() < cfg.route_share:
                spec = rng.choice(cfg.route_specs)
                frames = draw_route(rng, spec, seeds, banned, cfg.route_frames)
                # No draw at 0, so earlier recipes keep their exact example streams.
                if cfg.route_stop_share and rng.random() < cfg.route_stop_share:
                    frames = [*frames[:-1], on_goal(frames[-1])]
                trajs.append(route_example(policy, frames, cell_px=cfg.cell_px))
            else:
                m, a = _draw(cfg, rng, seeds, banned)
                trajs.append(perception_example(policy, m, a, cell_px=cfg.cell_px, ids=ids))
        model.train()
        loss = supervised_step(policy, trajs, opt, sched, params)
        report.losses.append(float(loss.detach()))
        report.steps_done = step + 1
        if snapshot is not None and cfg.snapshot_every and (step + 1) % cfg.snapshot_every == 0:
            model.eval()
            snapshot(step + 1)
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
            model.eval()
            row: dict[str, float] = {
                "step": step + 1,
                "seconds": time.perf_counter() - t_start,
                "loss": float(loss.detach()),
            }
            for spec, mazes in checks.items():
                for k, v in reading_accuracy(policy, mazes, cell_px=cfg.cell_px).items():
                    row[f"{spec}/{k}"] = v
            if cfg.route_share:
                for walked in (False, True):
                    routes = route_accuracy(
                        policy, cfg.route_eval_set, cell_px=cfg.cell_px, walked=walked
                    )
                    tag = "walked_" if walked else ""
                    row.update({f"{cfg.route_eval_set}/{tag}{k}": v for k, v in routes.items()})
                stops = stop_reading(policy, cfg.route_eval_set, cell_px=cfg.cell_px)
                row.update({f"{cfg.route_eval_set}/{k}": v for k, v in stops.items()})
            report.evals.append(row)
            if log is not None:
                log(row)
    model.eval()
    report.seconds = time.perf_counter() - t_start
    return report


def pretrain(
    config: MazerlConfig,
    out: Path,
    *,
    command: str,
    log: Callable[[dict[str, float]], None] | None = None,
) -> Path:
    """Pretrain a tiny model's perception (``local.perception``) and save it as an artifact.

    The model starts from ``local.perception.init``: built here from ``local.tiny_model``
    (``random``), or an earlier artifact or model directory, recorded in the recipe with the
    sha256 of its weights. ``out`` receives the merged model, ``recipe.json`` (``command``, the
    settings, the final reading and route accuracy, maze-env's version) and a weight-sync
    manifest, swapped in whole, so the directory can be shipped under
    ``maze_engine/artifacts/`` and verified on every load.
    """
    from maze_engine.artifacts import model_dir
    from maze_engine.sft import save_merged
    from maze_env import __version__ as maze_env_version
    from maze_policy.model import TinyVLMConfig, build_tiny_vlm, load_vlm
    from maze_policy.policy import Policy
    from weight_sync import fs

    cfg = config.local.perception
    torch.set_num_threads(config.local.torch_threads)
    with fs.staged_dir(out) as staged:
        started_from: dict[str, str] = {"init": cfg.init}
        if cfg.init == "random":
            init = staged / ".init"
            build_tiny_vlm(init, seed=cfg.seed, config=TinyVLMConfig(**config.local.tiny_model))
        else:
            init = model_dir(cfg.init)
            started_from["init_weights_sha256"] = fs.hash_file(init / "model.safetensors")[1]
        model, processor = load_vlm(init)
        policy = Policy(model, processor)

        def snapshot(step: int) -> None:
            save_merged(policy, Path(f"{out}.snapshots") / f"step_{step}")

        report = run_perception(policy, cfg, log=log, snapshot=snapshot)
        save_merged(policy, staged)
        if cfg.init == "random":
            shutil.rmtree(init)
        recipe = {
            "command": command,
            **started_from,
            "perception": asdict(cfg),
            "tiny_model": dict(config.local.tiny_model),
            "maze_env": maze_env_version,
            "steps_done": report.steps_done,
            "seconds": round(report.seconds, 1),
            "final_loss": report.losses[-1] if report.losses else None,
            "reading": report.evals[-1] if report.evals else {},
            "evals": report.evals,
            "held_out_sets": list(HELD_OUT_SETS),
        }
        fs.atomic_write_json(staged / "recipe.json", recipe, indent=1, sort_keys=True)
        fs.write_manifest(staged, producer="maze-train pretrain")
    return out
