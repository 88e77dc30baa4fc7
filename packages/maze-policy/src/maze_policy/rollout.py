"""Multi-turn maze rollouts through the skyrl-gym env class that SkyRL runs on the cluster.

Every episode is a ``maze`` env from maze-verifier, built from its dataset row exactly as
SkyRL builds it (``skyrl_gym.make("maze", env_config=..., extras=row minus prompt/env_class)``).
Episodes advance in lockstep: each turn, one batched ``generate`` answers every unfinished
episode, the env scores the reply, and its observation (feedback text + new image) is appended
to that episode's token sequence with loss mask 0. The sampled tokens keep mask 1 and their
sampling-time log-probs.

The ``context`` an episode's turns are answered in is one of
:data:`~maze_policy.contexts.CONTEXTS`: ``full`` (the whole conversation so far, VisGym's and
SkyRL's multi-turn format), ``latest`` (the system prompt and the latest user turn only: the
current frame and the env's feedback), ``recent`` (``latest`` with the policy's previous
reply before the user turn, so feedback such as a bump says which move it was about),
``route`` (the latest frame alone, asked :data:`~maze_policy.contexts.ROUTE_QUESTION`, for a
base pretrained on that question) or ``route-recent`` (``route`` with the previous reply before
it, so the policy sees which way it came). With all but ``full`` each turn is its own token
sequence, prompt and reply, kept in ``Episode.turn_trajectories``; a policy that reads one frame
at a time never meets the long multi-image contexts a small model loses track in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from maze_env.export import ENV_CLASS
from maze_policy.contexts import (
    CONTEXTS,
    PER_TURN_CONTEXTS,
    RECENT_CONTEXTS,
    ROUTE_CONTEXTS,
    ROUTE_QUESTION,
    check_context,
    is_image_part,
)
from maze_policy.errors import ChatEncodingError
from maze_policy.sampling import SamplingParams
from maze_policy.seeds import derive_seed

if TYPE_CHECKING:  # the episode loop itself needs no torch: endpoint evaluation uses it too
    from maze_policy.chat import Trajectory
    from maze_policy.policy import Policy


__all__ = [  # the context names are re-exported: they were defined here first
    "CONTEXTS",
    "OPENING_STATE",
    "PER_TURN_CONTEXTS",
    "RECENT_CONTEXTS",
    "ROUTE_CONTEXTS",
    "ROUTE_QUESTION",
    "Episode",
    "check_context",
    "drop_nulls",
    "env_extras",
    "in_context",
    "latest_turn",
    "make_env",
    "route_turn",
    "run_episodes",
    "state_key",
    "turn_messages",
]


def latest_turn(
    opening: Sequence[Mapping[str, Any]],
    observations: Sequence[Mapping[str, Any]],
    previous_reply: str | None = None,
) -> list[Mapping[str, Any]]:
    """What a later turn is answered from in context ``latest`` (or ``recent``).

    The opening's system prompt, then (``recent``) the ``previous_reply`` as the assistant's
    message, then that turn's user messages (the frame and the feedback).
    """
    previous = [] if previous_reply is None else [{"role": "assistant", "content": previous_reply}]
    return [*(m for m in opening if m.get("role") == "system"), *previous, *observations]


def route_turn(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """What a turn is answered from in context ``route``: one user message, frames and question.

    The frames are those of the last user message in ``messages``, the question
    :data:`ROUTE_QUESTION`. The system prompt and the env's text (task, feedback, turns left)
    are left out: a base pretrained on that question alone reads its task turns as it read its
    pretraining. A :class:`~maze_policy.errors.ChatEncodingError` when the last user message
    has no image.
    """
    users = [m for m in messages if m.get("role") == "user"]
    content = users[-1].get("content") if users else None
    parts = cast(list[Mapping[str, Any]], content) if isinstance(content, list) else []
    frames = [p for p in parts if is_image_part(p)]
    if not frames:
        raise ChatEncodingError(
            "context 'route' answers the frame of the last user message, and it has none"
        )
    return [{"role": "user", "content": [*frames, {"type": "text", "text": ROUTE_QUESTION}]}]


def turn_messages(
    context: str,
    opening: Sequence[Mapping[str, Any]],
    observations: Sequence[Mapping[str, Any]] | None = None,
    previous_reply: str | None = None,
) -> list[Mapping[str, Any]]:
    """What one turn of an episode is answered from in ``context``: rollouts and demonstrations.

    The opening turn (no ``observations``) is the env's ``opening`` messages, in ``route`` its
    frame and the question. A later turn, whose user messages are ``observations`` and which
    follows the policy's ``previous_reply``, is :func:`latest_turn` in ``latest`` and ``recent``
    (the reply kept in ``recent`` only) and :func:`route_turn` in ``route`` (with the reply
    before it in ``route-recent``). In ``full`` a later turn extends the one conversation
    instead, so asking for one is a ValueError.
    """
    if check_context(context) in ROUTE_CONTEXTS:
        if observations is None:
            return route_turn(opening)
        previous = (
            [{"role": "assistant", "content": previous_reply}]
            if context in RECENT_CONTEXTS and previous_reply is not None
            else []
        )
        return [*previous, *route_turn(observations)]
    if observations is None:
        return list(opening)
    if context not in PER_TURN_CONTEXTS:
        raise ValueError(f"context {context!r} has no turn of its own after the opening")
    return latest_turn(opening, observations, previous_reply if context == "recent" else None)


def in_context(messages: Sequence[Mapping[str, Any]], context: str) -> list[Mapping[str, Any]]:
    """What a policy trained in ``context`` answers a whole conversation from.

    For a client or a server that holds the whole conversation, as OpenAI clients send it:
    ``full`` keeps it; ``latest`` keeps its system messages and the messages after the last
    assistant reply, as :func:`latest_turn` builds a turn in training; ``recent`` keeps that
    reply too. A conversation with no reply yet is an opening and is kept whole, as in training.
    ``route`` answers every turn, the opening too, from :func:`route_turn`; ``route-recent``
    puts the last reply, if any, before it.
    """
    if check_context(context) == "full":
        return list(messages)
    replies = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if context in ROUTE_CONTEXTS:
        previous = [messages[replies[-1]]] if context in RECENT_CONTEXTS and replies else []
        return [*previous, *route_turn(messages)]
    if not replies:
        return list(messages)
    last = replies[-1]
    previous = [messages[last]] if context == "recent" else []
    system = [m for m in messages[:last] if m.get("role") == "system"]
    return [*system, *previous, *messages[last + 1 :]]


@dataclass
class Episode:
    """One finished episode: its tokens and what the environment made of it.

    ``trajectory`` is the whole conversation (context ``full``); with context ``latest`` it is
    empty and ``turn_trajectories`` holds each turn's own prompt and reply. :attr:`sequences`
    is what a learner scores either way.
    """

    row_index: int
    group: int
    trajectory: Trajectory
    reward: float = 0.0
    solved: bool = False
    turns: int = 0
    replies: list[str] = field(default_factory=list[str])
    metadata: dict[str, Any] = field(default_factory=dict[str, Any])
    turn_trajectories: list[Trajectory] = field(default_factory=list["Trajectory"])
    states: list[str] = field(default_factory=list[str])
    """What each turn was answered from, one per turn: :data:`OPENING_STATE` for the first (the
    row's prompt), then :func:`state_key` of the step before (the square, and that move's
    outcome). Empty when the env's step metadata names no ``agent``. Turns of a group that met
    the same state can be compared with each other (step-level advantages)."""

    @property
    def sequences(self) -> list[Trajectory]:
        """The token sequences the policy answered in: one per turn, or the one conversation."""
        return self.turn_trajectories or [self.trajectory]


OPENING_STATE = "opening"
"""The state of an episode's first turn: every episode of a GRPO group opens on the same prompt."""


def state_key(metadata: Mapping[str, Any]) -> str | None:
    """A key for what the turn after a step sees, from the step's ``metadata``.

    The agent's square and the step's ``outcome`` (``moved``, ``bumped``, ...): the frame shows
    the square, the feedback the outcome. The turns left, which the feedback also says, are
    left out, so turns of a group on the same square compare whatever their timing. None when
    the metadata names no ``agent``.
    """
    agent = metadata.get("agent")
    if agent is None:
        return None
    square = ",".join(str(v) for v in cast(Sequence[Any], agent))
    return f"{square}:{metadata.get('outcome')}"


def env_extras(row: Mapping[str, Any]) -> dict[str, Any]:
    """What SkyRL passes an env as ``extras``: every dataset column but ``prompt`` and ``env_class``."""
    return {k: v for k, v in row.items() if k not in ("prompt", "env_class")}


def drop_nulls(value: Any) -> Any:
    """Remove ``None`` fields that parquet adds to content parts, recursively.

    A text part read back from parquet carries ``image_url: None``; dropping it makes a message
    read the same as before export.
    """
    if isinstance(value, Mapping):
        return {
            k: drop_nulls(v) for k, v in cast(Mapping[str, Any], value).items() if v is not None
        }
    if isinstance(value, list):
        return [drop_nulls(v) for v in cast(list[Any], value)]
    return value


def make_env(row: Mapping[str, Any], env_config: Mapping[str, Any] | None = None) -> Any:
    """The skyrl-gym env for ``row``, built exactly as SkyRL builds it (``skyrl_gym.make``)."""
    import skyrl_gym

    from maze_verifier import register_env

    env_class = str(row.get("env_class", ENV_CLASS))
    register_env(env_class)
    return cast(
        Any, skyrl_gym.make(env_class, env_config=dict(env_config or {}), extras=env_extras(row))
    )  # pyright: ignore[reportUnknownMemberType]


def run_episodes(
    policy: Policy,
    rows: Sequence[Mapping[str, Any]],
    *,
    sampling: SamplingParams,
    seed: int,
    row_indices: Sequence[int] | None = None,
    groups: Sequence[int] | None = None,
    env_config: Mapping[str, Any] | None = None,
    max_turns: int | None = None,
    keep_cache: bool = True,
    context: str = "full",
) -> list[Episode]:
    """Play one episode per row (repeat a row for GRPO samples) and return them in input order.

    ``seed`` fixes every sampling decision; turn ``t`` samples with ``derive_seed(seed, t)``.
    ``max_turns`` caps turns on top of each env's own budget. The envs hand their images over
    as PIL images (``inline_images``): the encoder is in this process, so a PNG data URI would
    only be encoded to be decoded again (same pixels either way); ``env_config`` may say
    ``inline_images: false``. With ``keep_cache`` the episodes keep their key/value cache from
    turn to turn (:class:`~maze_policy.incremental.IncrementalGenerator`), so a turn reads only
    its new tokens; without it every turn re-reads the whole conversation (``Policy.generate``).
    ``context`` is one of :data:`~maze_policy.contexts.CONTEXTS`.
    """
    from maze_policy.chat import Trajectory

    per_turn = check_context(context) in PER_TURN_CONTEXTS
    tok = policy.processor.tokenizer
    config = {"inline_images": True, **(env_config or {})}
    envs = [make_env(row, config) for row in rows]
    episodes: list[Episode] = []
    # The sequence each episode's next reply extends: its conversation, or this turn's prompt.
    current: list[Trajectory] = []
    openings: list[Sequence[Mapping[str, Any]]] = []
    # The state each episode's next turn is answered in, while its env reports one.
    state: list[str | None] = [OPENING_STATE] * len(rows)
    for i, (row, env) in enumerate(zip(rows, envs, strict=True)):
        prompt = cast(Sequence[Mapping[str, Any]], env.init(drop_nulls(row["prompt"]))[0])
        traj = policy.encoder.start(turn_messages(context, prompt))
        current.append(traj)
        openings.append(prompt)
        episodes.append(
            Episode(
                row_index=row_indices[i] if row_indices is not None else i,
                group=groups[i] if groups is not None else i,
                trajectory=Trajectory() if per_turn else traj,
            )
        )
    generate = policy.generate
    if keep_cache:
        from maze_policy.incremental import IncrementalGenerator

        generate = IncrementalGenerator(policy).generate
    active = list(range(len(episodes)))
    turn = 0
    while active:
        gens = generate([current[i] for i in active], sampling, seed=derive_seed(seed, turn))
        still: list[int] = []
        for i, gen in zip(active, gens, strict=True):
            ep = episodes[i]
            policy.encoder.add_assistant(current[i], gen.token_ids, gen.logprobs)
            if per_turn:
                ep.turn_trajectories.append(current[i])
            text = str(tok.decode(gen.token_ids, skip_special_tokens=True))
            ep.replies.append(text)
            if state[i] is not None:
                ep.states.append(cast(str, state[i]))
            out = cast(Mapping[str, Any], envs[i].step(text))
            state[i] = state_key(cast(Mapping[str, Any], out.get("metadata") or {}))
            ep.turns += 1
            done = bool(out["done"]) or (max_turns is not None and ep.turns >= max_turns)
            if done:
                ep.reward = float(out["reward"])
                ep.metadata = dict(cast(Mapping[str, Any], envs[i].get_metrics()))
                ep.solved = bool(ep.metadata.get("solved", False))
                if len(ep.states) != ep.turns:  # a step named no agent: no states at all
                    ep.states = []
                envs[i].close()
                continue
            observations = cast(Sequence[Mapping[str, Any]], out["observations"])
            if per_turn:
                current[i] = policy.encoder.start(
                    turn_messages(context, openings[i], observations, text)
                )
            else:
                for message in observations:
                    policy.encoder.add_user(current[i], message)
            still.append(i)
        active = still
        turn += 1
    return episodes
