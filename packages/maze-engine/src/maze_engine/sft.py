"""Warm start: supervised fine-tuning on oracle maze episodes, and greedy end-to-end evaluation.

The oracle plays ``maze.optimal_actions`` then ``stop``; each turn's reply is in VisGym's SFT
format (``<observation>``, ``<justification>``, ``<action>``) and each following user turn is the
real :func:`maze_env.prompts.feedback_message` with the real rendered image, so the training
conversations are exactly what a rollout shows the policy.

SFT trains **all weights** (AdamW): the tiny model starts random, and LoRA on a random model
barely moves it. The result is saved as a plain (merged) checkpoint directory that
:func:`maze_policy.model.load_vlm` loads, the analogue of the VisGym SFT checkpoint that GRPO +
LoRA starts from on the cluster.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from maze_engine.config import DEMONSTRATORS, REPLY_FORMATS, WarmStartConfig
from maze_engine.errors import MazeEngineError
from maze_policy.chat import Trajectory
from maze_policy.policy import Policy, sequence_logprobs
from maze_policy.sampling import SamplingParams
from maze_policy.seeds import derive_seed


def _style(cell_px: int) -> Any:
    from maze_env.render import Style

    return Style(cell_px=cell_px)


def demonstration(
    policy: Policy,
    maze: Any,
    *,
    demonstrator: str = "oracle",
    reply: str = "visgym",
    cell_px: int = 32,
    slack: int | None = None,
    rng: random.Random | None = None,
) -> tuple[Trajectory, bool]:
    """Encode one demonstrated episode on ``maze`` as one conversation; say if it solved the maze.

    The oracle plays every optimal move then ``stop``; the explorer plays until it stops on the
    goal or the turn budget runs out (``rng`` draws its fork choices). ``slack`` sets the turn
    budget that the prompt and every feedback state (maze-env's default if None): the warm
    start demonstrates at the budget its model is evaluated and trained with. Each following
    user turn is the real feedback with the real rendered image, as a rollout shows it.
    """
    sequences, solved = demonstration_sequences(
        policy,
        maze,
        demonstrator=demonstrator,
        reply=reply,
        cell_px=cell_px,
        slack=slack,
        rng=rng,
    )
    return sequences[0], solved


def demonstration_sequences(
    policy: Policy,
    maze: Any,
    *,
    context: str = "full",
    demonstrator: str = "oracle",
    reply: str = "visgym",
    cell_px: int = 32,
    slack: int | None = None,
    rng: random.Random | None = None,
) -> tuple[list[Trajectory], bool]:
    """:func:`demonstration` in a rollout ``context``: the sequences a policy would answer in.

    ``full``: the one conversation. ``latest``: one sequence per turn, the system prompt and
    that turn's user message (its frame and feedback) then the reply; ``recent``: the same with
    the previous reply before the user message; ``route``: each turn's frame and the route
    question, then the reply; ``route-recent``: those with the previous reply before them; as
    :func:`maze_policy.rollout.run_episodes` shows a policy each turn in that context.
    """
    from maze_env import DEFAULT_SLACK, MazeGame
    from maze_env.agents import ExplorerAgent
    from maze_env.prompts import action_reply, feedback_message, initial_messages, oracle_reply
    from maze_env.render import Renderer
    from maze_policy.contexts import PER_TURN_CONTEXTS, check_context
    from maze_policy.rollout import turn_messages

    per_turn = check_context(context) in PER_TURN_CONTEXTS
    if demonstrator not in DEMONSTRATORS:
        raise ValueError(f"demonstrator must be one of {DEMONSTRATORS}, got {demonstrator!r}")
    if reply not in REPLY_FORMATS:
        raise ValueError(f"reply must be one of {REPLY_FORMATS}, got {reply!r}")
    renderer = Renderer(maze, _style(cell_px))
    game = MazeGame.start(maze, slack=DEFAULT_SLACK if slack is None else slack)
    enc = policy.encoder
    opening = initial_messages(maze, game.step_budget, renderer=renderer)
    traj = enc.start(turn_messages(context, opening))
    sequences = [traj]
    route = iter([d.word for d in maze.optimal_actions] + ["stop"])
    explorer = ExplorerAgent(maze, rng or random.Random(maze.seed))
    while not game.done:
        word = next(route) if demonstrator == "oracle" else explorer.act(game.agent)
        text = (
            oracle_reply(game.agent, maze.goal, word) if reply == "visgym" else action_reply(word)
        )
        enc.add_assistant_text(traj, text)
        result = game.step(word)
        if game.done:
            break
        message = feedback_message(result, game.agent, game.steps_left, renderer)
        if per_turn:
            traj = enc.start(turn_messages(context, opening, [message], text))
            sequences.append(traj)
        else:
            enc.add_user(traj, message)
    if demonstrator == "oracle" and not game.solved:
        raise OracleError(f"oracle failed on maze seed {maze.seed}: a maze_env bug")
    return sequences, game.solved


def oracle_episode(
    policy: Policy, maze: Any, *, cell_px: int = 32, slack: int | None = None
) -> Trajectory:
    """The oracle's episode on ``maze`` in VisGym's reply format (see :func:`demonstration`)."""
    return demonstration(policy, maze, cell_px=cell_px, slack=slack)[0]


@dataclass(frozen=True, slots=True)
class EvalResult:
    """Totals of one :func:`evaluate_policy` run; ``seconds`` is its wall time."""

    episodes: int
    solved: int
    mean_turns: float
    valid_action_rate: float
    seconds: float

    @property
    def solve_rate(self) -> float:
        return self.solved / self.episodes if self.episodes else 0.0


def evaluate_policy(
    policy: Policy,
    spec: str,
    seeds: Sequence[int],
    *,
    cell_px: int = 32,
    max_new_tokens: int = 32,
    batch_size: int = 16,
    params: SamplingParams | None = None,
    seed: int = 0,
    slack: int | None = None,
    context: str = "full",
) -> EvalResult:
    """Play whole episodes on ``spec`` mazes ``seeds`` through the skyrl-gym env.

    Episodes run as the trainer's rollouts and maze-eval run them
    (:func:`maze_policy.rollout.run_episodes`), ``batch_size`` games in lockstep at a time.

    Greedy by default. Step budgets are optimal + 1 + ``slack`` (maze-env's default slack);
    ``context`` is the rollouts' (``full`` or ``latest``).
    """
    from maze_env import DEFAULT_SLACK, MazeSpec
    from maze_env.export import build_rows
    from maze_policy.rollout import run_episodes

    params = params or SamplingParams(greedy=True, max_new_tokens=max_new_tokens)
    rows = build_rows(
        MazeSpec.parse(spec),
        seeds,
        split="validation",
        slack=DEFAULT_SLACK if slack is None else slack,
        style=_style(cell_px),
    )
    t0 = time.perf_counter()
    solved = turns = invalid = 0
    for lo in range(0, len(rows), batch_size):
        for ep in run_episodes(
            policy,
            rows[lo : lo + batch_size],
            sampling=params,
            seed=derive_seed(seed, lo),
            context=context,
        ):
            solved += ep.solved
            turns += ep.turns
            invalid += int(ep.metadata.get("invalid", 0))
    n = len(rows)
    return EvalResult(
        episodes=n,
        solved=solved,
        mean_turns=turns / n if n else 0.0,
        valid_action_rate=1.0 - invalid / turns if turns else 0.0,
        seconds=time.perf_counter() - t0,
    )


class OracleError(MazeEngineError):
    """The oracle's own episode did not solve its maze: a bug in maze-env, never bad input."""


@dataclass
class SFTReport:
    """What :func:`run_sft` did: its settings, every step's loss, periodic evals, time spent."""

    config: dict[str, Any]
    losses: list[float] = field(default_factory=list[float])
    action_accuracy: list[float] = field(default_factory=list[float])
    evals: list[dict[str, float]] = field(default_factory=list[dict[str, float]])
    first_moves: list[dict[str, float]] = field(default_factory=list[dict[str, float]])
    """Every ``track_every`` steps: ``step`` and the greedy first-move rates on the eval set."""
    seconds: float = 0.0
    steps_done: int = 0
    base_solve_rate: float | None = None
    """Greedy solve rate of the model before the warm start, when the caller measured it."""
    base_label: str | None = None
    """What that model was (``random init``, an artifact's name)."""
    demonstrations_solved: float | None = None
    """Share of the demonstrated episodes that solved their maze (1.0 for the oracle)."""


DECISION_TAGS = ("<justification>", "<action>")
"""The reply token right after each of these carries the decision: the tokenizer writes a whole
justification (``Moving right follows ...``) and the action word as one token each."""


def decision_positions(
    policy: Policy, input_ids: torch.Tensor, tags: Sequence[str] = DECISION_TAGS
) -> torch.Tensor:
    """True where a token directly follows one of ``tags`` (tags not in the vocabulary: none)."""
    vocab = policy.processor.tokenizer.get_vocab()
    after = torch.zeros_like(input_ids, dtype=torch.bool)
    for tag in tags:
        if tag in vocab:
            after[:, 1:] |= input_ids[:, :-1] == int(vocab[tag])
    return after


def sft_loss(
    policy: Policy, trajectories: Sequence[Trajectory], *, decision_weight: float = 1.0
) -> torch.Tensor:
    """Mean negative log-likelihood per assistant token (the policy distribution, T = 1).

    ``decision_weight`` > 1 counts each decision token (:func:`decision_positions`) that many
    times: one route choice is ~1 token of an episode's ~100, so its error barely moves the mean.
    """
    batch = policy.collate(trajectories)
    lp = sequence_logprobs(policy.model, batch, suppress_ids=policy.suppress_ids)
    weight = batch.loss_mask.to(lp.dtype)
    if decision_weight != 1.0:
        decisions = decision_positions(policy, batch.input_ids).to(lp.dtype)
        weight = weight * (1.0 + (decision_weight - 1.0) * decisions)
    return -(lp * weight).sum() / weight.sum().clamp(min=1)


def supervised_step(
    policy: Policy,
    trajectories: Sequence[Trajectory],
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    params: Sequence[torch.Tensor],
    *,
    decision_weight: float = 1.0,
) -> torch.Tensor:
    """One optimizer step on :func:`sft_loss` (gradients clipped to norm 1); returns the loss."""
    loss = sft_loss(policy, trajectories, decision_weight=decision_weight)
    opt.zero_grad(set_to_none=True)
    loss.backward()  # pyright: ignore[reportUnknownMemberType]
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()  # pyright: ignore[reportUnknownMemberType]
    sched.step()
    return loss


def action_accuracy(policy: Policy, trajectories: Sequence[Trajectory]) -> float:
    """Teacher-forced accuracy of the greedy choice at each ``<action>`` word (the decision token)."""
    batch = policy.collate(trajectories)
    with torch.no_grad():
        logits = cast(Any, policy.model)(**batch.model_inputs(), use_cache=False).logits[:, :-1]
    if policy.suppress_ids:
        logits = logits.index_fill(-1, torch.tensor(policy.suppress_ids), float("-inf"))
    pred = logits.argmax(-1)
    target = batch.input_ids[:, 1:]
    mask = batch.loss_mask[:, 1:].bool()
    if "<action>" in policy.processor.tokenizer.get_vocab():
        # The word right after the "<action>" token; fall back to every assistant token otherwise.
        mask = mask & decision_positions(policy, batch.input_ids, ("<action>",))[:, 1:]
    hits = (pred == target) & mask
    return float(hits.sum()) / max(1, int(mask.sum()))


def _lr_lambda(cfg: WarmStartConfig) -> Any:
    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    return f


def _route_source(
    policy: Policy,
    count: int,
    *,
    stream_seed: int,
    spec: str,
    cell_px: int,
    avoid: Collection[str],
    stop_share: float,
) -> Callable[[], list[Trajectory]]:
    """A source of ``count`` route-question examples per call, all from one stream.

    Mazes of ``spec`` whose layout is in ``avoid`` or in a held-out eval set are never drawn.
    ``stop_share`` as in :func:`_route_questions`.
    """
    rng, seeds = _route_stream(stream_seed)
    banned = _rehearsal_banned(avoid)
    return lambda: _route_questions(
        policy,
        count,
        rng=rng,
        seeds=seeds,
        spec=spec,
        banned=banned,
        cell_px=cell_px,
        stop_share=stop_share,
    )


def route_rehearsal_batch(
    policy: Policy,
    count: int,
    *,
    spec: str,
    seed: int,
    cell_px: int,
    avoid: Collection[str],
    stop_share: float = 0.0,
) -> list[Trajectory]:
    """``count`` route-question examples drawn from ``seed`` alone, for one GRPO step.

    Stateless, so a resumed run draws the step's questions again: the trainer seeds each step's
    batch from its global step. Mazes of ``spec`` whose layout is in ``avoid`` or in a held-out
    eval set are never drawn. ``stop_share`` as in :func:`_route_questions`.
    """
    return _route_source(
        policy,
        count,
        stream_seed=seed,
        spec=spec,
        cell_px=cell_px,
        avoid=avoid,
        stop_share=stop_share,
    )()


def _route_stream(seed: int) -> tuple[random.Random, Iterator[int]]:
    import itertools

    rng = random.Random(seed)
    # Maze seeds far above the training rows' and the demonstrations', so none is repeated.
    return rng, itertools.count(rng.randrange(2**40, 2**41))


def _rehearsal_banned(avoid: Collection[str]) -> set[str]:
    from maze_engine.perception import held_out_layouts

    return {*avoid, *held_out_layouts()}


def _route_questions(
    policy: Policy,
    count: int,
    *,
    rng: random.Random,
    seeds: Iterator[int],
    spec: str,
    banned: set[str],
    cell_px: int,
    stop_share: float,
) -> list[Trajectory]:
    """``count`` one-frame route questions, a ``stop_share`` of them on the goal.

    Each is, with probability ``stop_share``, asked with the agent on the goal and answered
    ``stop``. Route questions otherwise never show the agent on the goal: the stop is then
    learned only from task episodes, whose goals stand on corners.
    """
    from maze_engine.perception import draw_route, on_goal, route_example

    out: list[Trajectory] = []
    for _ in range(count):
        frames = draw_route(rng, spec, seeds, banned, 1)
        # No draw at 0, so runs without stops keep their exact question streams.
        if stop_share and rng.random() < stop_share:
            frames = [on_goal(frames[0])]
        out.append(route_example(policy, frames, cell_px=cell_px))
    return out


def run_sft(
    policy: Policy,
    config: WarmStartConfig,
    *,
    spec: str,
    seed: int,
    cell_px: int,
    avoid: Collection[str] = (),
    out_dir: str | Path | None = None,
    log: Callable[[dict[str, float]], None] | None = None,
    track: Callable[[], dict[str, float]] | None = None,
    slack: int | None = None,
    context: str = "full",
) -> SFTReport:
    """Train ``policy.model`` in place on oracle episodes of ``spec`` mazes.

    Stops after ``config.steps`` steps, or ``config.max_seconds`` of training time when set.
    Mazes whose ``layout_hash`` is in ``avoid`` (a held-out eval set's layouts) are skipped.
    ``config.demonstrator`` plays the episodes and ``config.reply`` words them
    (:func:`demonstration`).
    ``track`` (e.g. :func:`maze_engine.decisions.first_move_rates` on the eval set) runs every
    ``config.track_every`` steps and after the last; ``slack`` is the turn slack the
    demonstrations' prompts state and the periodic evaluations give (the main job's, so that the
    warm start shows the budget GRPO and the evaluation use; maze-env's default if None).
    Training mazes are seeded from maze-env's ``TRAIN_SEED_OFFSET`` on, so they never meet the
    eval sets' small seeds; ``out_dir`` saves the merged model there. ``context`` is the
    rollouts' (:func:`demonstration_sequences`); a step trains on every sequence of
    ``config.batch_size`` episodes, and ``config.route_rehearsal`` route questions on mazes of
    their own stream (no ``avoid`` or pretraining held-out layout among them).
    """
    from maze_env import generate
    from maze_env.export import TRAIN_SEED_OFFSET

    model = policy.model
    report = SFTReport(config={**asdict(config), "spec": spec, "seed": seed, "cell_px": cell_px})
    if config.freeze_patch_embed:
        for name, p in model.named_parameters():
            if "patch_embed" in name:
                p.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(config))
    rng_seed = TRAIN_SEED_OFFSET + seed * 1_000_003
    next_seed = rng_seed
    explorer_rng = random.Random(rng_seed)
    # Without route questions a full fine-tune on the task's prompt overwrites the route skill
    # the base was pretrained for instead of reusing it (docs/experiments: route rehearsal).
    # One stream for the whole warm start, apart from the demonstrations' maze seeds.
    rehearse: Callable[[], list[Trajectory]] = (
        _route_source(
            policy,
            config.route_rehearsal,
            stream_seed=derive_seed(seed, "route-rehearsal"),
            spec=spec,
            cell_px=cell_px,
            avoid=avoid,
            stop_share=config.route_stop_share,
        )
        if config.route_rehearsal
        else lambda: []
    )
    train_time = 0.0
    solved = played = 0
    for step in range(config.steps):
        if config.max_seconds is not None and train_time >= config.max_seconds:
            break
        ts = time.perf_counter()
        mazes: list[Any] = []
        while len(mazes) < config.batch_size:
            maze = generate(spec, next_seed)
            next_seed += 1
            if maze.layout_hash() not in avoid:
                mazes.append(maze)
        trajs: list[Trajectory] = []
        for maze in mazes:
            sequences, ok = demonstration_sequences(
                policy,
                maze,
                context=context,
                demonstrator=config.demonstrator,
                reply=config.reply,
                cell_px=cell_px,
                slack=slack,
                rng=explorer_rng,
            )
            trajs.extend(sequences)
            solved, played = solved + ok, played + 1
        report.demonstrations_solved = solved / played
        trajs.extend(rehearse())
        model.train()
        loss = supervised_step(
            policy, trajs, opt, sched, params, decision_weight=config.decision_weight
        )
        train_time += time.perf_counter() - ts
        report.losses.append(float(loss.detach()))
        report.steps_done = step + 1
        last = step + 1 == config.steps or (
            config.max_seconds is not None and train_time >= config.max_seconds
        )
        if (
            track is not None
            and config.track_every
            and ((step + 1) % config.track_every == 0 or last)
        ):
            model.eval()
            rates = track()
            report.first_moves.append({"step": float(step + 1), **rates})
            if log is not None:
                moves = {f"first_move/{k}": v for k, v in rates.items()}
                log({"step": step + 1, "loss": float(loss.detach()), **moves})
        if config.eval_every and (step + 1) % config.eval_every == 0:
            model.eval()
            res = evaluate_policy(
                policy,
                spec,
                tuple(range(config.eval_mazes)),
                cell_px=cell_px,
                max_new_tokens=config.max_new_tokens,
                slack=slack,
                context=context,
            )
            row = {
                "step": step + 1,
                "train_seconds": train_time,
                "solve_rate": res.solve_rate,
                "valid_action_rate": res.valid_action_rate,
                "loss": float(loss.detach()),
            }
            report.evals.append(row)
            if log is not None:
                log(row)
        elif log is not None and (step + 1) % 25 == 0:
            log(
                {
                    "step": step + 1,
                    "train_seconds": round(train_time, 1),
                    "loss": float(loss.detach()),
                }
            )
    model.eval()
    report.seconds = train_time
    if out_dir is not None:
        save_merged(policy, out_dir, report)
    return report


def save_merged(policy: Policy, out_dir: str | Path, report: SFTReport | None = None) -> Path:
    """Save model (LoRA merged if present), tokenizer and image processor as a loadable directory."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model: Any = policy.model
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    model.save_pretrained(out)
    policy.processor.tokenizer.save_pretrained(out)
    policy.processor.image_processor.save_pretrained(out)
    if report is not None:
        (out / "sft_report.json").write_text(json.dumps(asdict(report), indent=1))
    return out
