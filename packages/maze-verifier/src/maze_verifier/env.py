"""The skyrl-gym environment SkyRL runs: one maze episode, one model reply per turn.

SkyRL builds it as ``skyrl_gym.make("maze", env_config=..., extras=row)``, where ``row`` is a
dataset row minus ``prompt`` and ``env_class`` (see maze-env's exporter). The maze is rebuilt
from ``preset`` + ``seed``; ``reward_spec.ground_truth.optimal_moves`` is checked against it so a
dataset written by a different generator fails loudly instead of training on wrong rewards.

``env_config`` keys (all optional; a dict or an OmegaConf ``DictConfig``):

* ``reward_spec``: registered spec name (``task``, ``visgym_sft``, ``efficiency``, ...) or a
  mapping of weights (see :func:`maze_verifier.specs.get_spec`); default ``task``. A row may
  override it with ``reward_spec.spec`` in its extras.
* ``slack``: extra turns for the step budget when a row has no ``step_budget``; default 4.
* ``max_turns``: cap on turns; default the row's step budget. A smaller cap ends the episode
  early, unfinished, even though the prompt promised the full budget. SkyRL also writes its
  ``generator.max_turns`` (default 1) into ``extras["max_turns"]``; that value is ignored, since
  the episode length belongs to the maze.
* ``cell_px``: pixels per grid square of the feedback images; default VisGym's 25. Use the value
  the dataset was exported with so every image in an episode has the same scale.
* ``max_action_chars``: longest reply parsed; longer ones are invalid turns. Default 65536.
* ``final_observation``: also return the last feedback message when the episode ends (SkyRL
  would append it to the chat); default False, the feedback is in ``metadata`` either way.
* ``inline_images``: images the env builds are PIL images in ``image`` parts instead of PNG
  data URIs in ``image_url`` parts (same pixels); default False. Only for a consumer in the
  same process (the local engine's rollouts): such messages cannot be serialised.

* ``mode``: ``turns`` (default; one action per turn, VisGym) or ``path`` (one turn whose reply is
  the whole path, AlphaMaze style, scored by :func:`maze_verifier.score.score_path`). Path mode
  needs a prompt that asks for a path; with an empty dataset prompt the env builds one.

A row may carry the same keys in ``extras["env_config"]``; they override ``env_config``. SkyRL 0.4
passes ``getattr(skyrl_gym_cfg, env_class, {})`` as ``env_config``, which stays empty for an env
class its config dataclass does not declare, so per-row settings are the portable route.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

from maze_env import (
    DEFAULT_SLACK,
    MAX_ACTION_CHARS,
    Maze,
    MazeGame,
    MazeSpecError,
    ParseFailure,
    generate,
    parse_action,
)
from maze_env.prompts import (
    feedback_message,
    image_part,
    initial_messages,
    inline_image_part,
    text_part,
)
from maze_env.render import DEFAULT_STYLE, Renderer, Style
from maze_verifier.errors import EpisodeOverError, MazeTextEnvConfigError
from maze_verifier.score import EpisodeScore, score_episode, score_path
from maze_verifier.specs import RewardSpec, RewardSpecError, get_spec

PATH_SYSTEM_PROMPT = (
    "You are shown a maze as an image. Walls are gray, paths are white, you are the blue circle "
    "and the goal is the red square. Give the whole path from the blue circle to the red square "
    "as a list of moves (right, up, left, down) inside <answer></answer>, for example "
    "<answer>right, right, down</answer>. Each move goes one square."
)


def path_messages(maze: Maze, renderer: Renderer, *, inline: bool = False) -> list[dict[str, Any]]:
    """System prompt and first user turn for a single-turn whole-path episode."""
    rows, cols = maze.shape
    return [
        {"role": "system", "content": PATH_SYSTEM_PROMPT},
        {
            "role": "user",
            "content": [
                inline_image_part(renderer.image()) if inline else image_part(renderer.data_uri()),
                text_part(f"Here is a {rows}x{cols} maze. What is the path to the goal?"),
            ],
        },
    ]


@dataclass(frozen=True, slots=True)
class MazeTextEnvConfig:
    """Parsed ``env_config``; see the module docstring for each key."""

    reward_spec: RewardSpec = field(default_factory=lambda: get_spec("task"))
    slack: int = DEFAULT_SLACK
    max_turns: int | None = None
    cell_px: int = DEFAULT_STYLE.cell_px
    max_action_chars: int = MAX_ACTION_CHARS
    final_observation: bool = False
    mode: Literal["turns", "path"] = "turns"
    inline_images: bool = False

    KEYS = frozenset(
        {
            "reward_spec",
            "slack",
            "max_turns",
            "cell_px",
            "max_action_chars",
            "final_observation",
            "mode",
            "inline_images",
        }
    )

    @classmethod
    def from_any(cls, cfg: object) -> MazeTextEnvConfig:
        if cfg is None:
            return cls()
        if isinstance(cfg, MazeTextEnvConfig):
            return cfg
        data = _as_mapping(cfg, "env_config")
        unknown = set(data) - cls.KEYS
        if unknown:
            raise MazeTextEnvConfigError(
                f"env_config has unknown keys {sorted(unknown)}; allowed: {sorted(cls.KEYS)}"
            )
        try:
            spec_value = data.get("reward_spec", "task")
            spec = get_spec(
                _as_mapping(spec_value, "env_config.reward_spec")
                if _is_mapping(spec_value)
                else spec_value
            )
        except RewardSpecError as e:
            raise MazeTextEnvConfigError(f"env_config.reward_spec: {e}") from e
        max_turns = data.get("max_turns")
        return cls(
            reward_spec=spec,
            slack=_int(data.get("slack", DEFAULT_SLACK), "env_config.slack", 0),
            max_turns=None if max_turns is None else _int(max_turns, "env_config.max_turns", 1),
            cell_px=_int(data.get("cell_px", DEFAULT_STYLE.cell_px), "env_config.cell_px", 4),
            max_action_chars=_int(
                data.get("max_action_chars", MAX_ACTION_CHARS), "env_config.max_action_chars", 1
            ),
            final_observation=bool(data.get("final_observation", False)),
            mode=_mode(data.get("mode", "turns")),
            inline_images=bool(data.get("inline_images", False)),
        )


def _is_mapping(value: object) -> bool:
    return isinstance(value, Mapping) or (hasattr(value, "keys") and hasattr(value, "__getitem__"))


def _as_mapping(value: object, name: str) -> dict[str, Any]:
    # OmegaConf DictConfig is not a typing Mapping subclass on every version; accept anything
    # with keys() and item access, and resolve nested configs to plain values.
    if isinstance(value, Mapping):
        return {str(k): v for k, v in cast(Mapping[Any, Any], value).items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if _is_mapping(value):
        obj = cast(Any, value)
        return {str(k): obj[k] for k in obj.keys()}  # noqa: SIM118 - not every config type iterates keys
    raise MazeTextEnvConfigError(f"{name} must be a mapping, got {type(value).__name__}")


def _mode(value: object) -> Literal["turns", "path"]:
    if value == "turns":
        return "turns"
    if value == "path":
        return "path"
    raise MazeTextEnvConfigError(f"env_config.mode must be 'turns' or 'path', got {value!r}")


def _int(value: object, name: str, minimum: int) -> int:
    """An int from config or a dataset row: ints (numpy's too), integral floats, digit strings."""
    out: int | None = None
    if isinstance(value, bool):
        out = None
    elif hasattr(value, "__index__"):
        out = operator.index(cast(Any, value))
    elif (isinstance(value, float) and value.is_integer()) or (
        isinstance(value, str) and value.strip().lstrip("-").isdigit()
    ):
        out = int(value)
    if out is None or out < minimum:
        raise MazeTextEnvConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
    return out


@dataclass(frozen=True, slots=True)
class MazeTask:
    """What one dataset row asks for: which maze, its budget and an optional per-row spec."""

    maze: Maze
    preset: str
    seed: int
    step_budget: int
    reward_spec: RewardSpec | None = None

    @classmethod
    def from_extras(cls, extras: object, slack: int = DEFAULT_SLACK) -> MazeTask:
        row = _as_mapping(extras if extras is not None else {}, "extras")
        info = (
            _as_mapping(row["extra_info"], "extras.extra_info")
            if _is_mapping(row.get("extra_info"))
            else {}
        )
        preset = row.get("preset", info.get("preset"))
        seed = row.get("seed", info.get("seed"))
        if not isinstance(preset, str) or not preset:
            raise MazeTextEnvConfigError(
                f"extras.preset must name a maze spec such as 'easy', got {preset!r}"
            )
        seed_i = _int(seed, "extras.seed", 0)
        try:
            maze = generate(preset, seed_i)
        except MazeSpecError as e:
            raise MazeTextEnvConfigError(f"extras.preset/seed: {e}") from e
        budget_raw = row.get("step_budget")
        budget = (
            maze.step_budget(slack)
            if budget_raw is None
            else _int(budget_raw, "extras.step_budget", 1)
        )

        spec: RewardSpec | None = None
        rs = row.get("reward_spec")
        if rs is not None:
            rs_map = _as_mapping(rs, "extras.reward_spec")
            truth = rs_map.get("ground_truth")
            if truth is not None:
                truth_map = _as_mapping(truth, "extras.reward_spec.ground_truth")
                expected = truth_map.get("optimal_moves")
                if (
                    expected is not None
                    and _int(expected, "ground_truth.optimal_moves", 0) != maze.optimal_moves
                ):
                    raise MazeTextEnvConfigError(
                        f"extras.reward_spec.ground_truth.optimal_moves is {expected} but maze {preset!r} "
                        f"seed {seed_i} has {maze.optimal_moves}: the dataset was built by a different generator"
                    )
            if rs_map.get("spec") is not None:
                try:
                    spec = get_spec(rs_map["spec"])
                except RewardSpecError as e:
                    raise MazeTextEnvConfigError(f"extras.reward_spec.spec: {e}") from e
        return cls(maze=maze, preset=preset, seed=seed_i, step_budget=budget, reward_spec=spec)


def _merged_config(env_config: object, extras: object) -> object:
    """``env_config`` with a row's ``extras["env_config"]`` on top.

    SkyRL 0.4 passes ``getattr(skyrl_gym_cfg, env_class, {})`` as ``env_config``, which is empty
    for an env class its config dataclass does not know, so rows may carry the settings instead.
    """
    row = _as_mapping(extras, "extras") if _is_mapping(extras) else {}
    override = row.get("env_config")
    if override is None:
        return env_config
    base = {} if env_config is None else _as_mapping(env_config, "env_config")
    return {**base, **_as_mapping(override, "extras.env_config")}


class MazeTextEnv(BaseTextEnv):
    """Multi-turn maze episode for SkyRL. Reward arrives on the final turn, 0 before it."""

    def __init__(self, env_config: Any = None, extras: Any = None) -> None:
        super().__init__()
        # A bad trainer-level env_config is an error even where a row overrides the key.
        MazeTextEnvConfig.from_any(env_config)
        self.config = MazeTextEnvConfig.from_any(_merged_config(env_config, extras))
        self.task = MazeTask.from_extras(extras, self.config.slack)
        self.reward_spec = self.task.reward_spec or self.config.reward_spec
        self.maze = self.task.maze
        path_mode = self.config.mode == "path"
        self.max_turns = 1 if path_mode else self.config.max_turns or self.task.step_budget
        self.renderer = Renderer(self.maze, Style(cell_px=self.config.cell_px))
        self.game = MazeGame.start(self.maze, step_budget=self.task.step_budget)
        self.replies: list[object] = []
        self.score: EpisodeScore | None = None

    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        """The dataset prompt as is, or the standard one if the row came without it."""
        if prompt:
            messages = prompt
        elif self.config.mode == "path":
            messages = cast(
                ConversationType,
                path_messages(self.maze, self.renderer, inline=self.config.inline_images),
            )
        else:
            messages = cast(
                ConversationType,
                initial_messages(
                    self.maze,
                    self.task.step_budget,
                    renderer=self.renderer,
                    inline=self.config.inline_images,
                ),
            )
        return messages, {
            "maze_hash": self.maze.content_hash(),
            "preset": self.task.preset,
            "seed": self.task.seed,
            "optimal_moves": self.maze.optimal_moves,
            "step_budget": self.task.step_budget,
            "max_turns": self.max_turns,
            "reward_spec": self.reward_spec.name,
            "mode": self.config.mode,
        }

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if self.game.done or self.turns >= self.max_turns:
            raise EpisodeOverError("episode is over; make a new environment")
        self.turns += 1
        self.replies.append(action)
        if self.config.mode == "path":
            return self._step_path(action)
        parsed = parse_action(action, max_chars=self.config.max_action_chars)
        result = self.game.step(cast(Any, parsed))  # a ParseFailure plays as an invalid turn
        done = self.game.done or self.turns >= self.max_turns
        metadata: dict[str, Any] = {
            "outcome": result.outcome,
            "feedback": result.feedback,
            "agent": list(self.game.agent),
            "steps_left": self.game.steps_left,
            "parse_failure": parsed.code if isinstance(parsed, ParseFailure) else None,
        }
        reward = 0.0
        if done:
            self.score = score_episode(
                self.maze,
                self.replies,
                self.reward_spec,
                step_budget=self.task.step_budget,
                max_chars=self.config.max_action_chars,
            )
            reward = self.score.reward
            metadata["score"] = self.score.to_dict()
        observations: list[dict[str, Any]] = []
        if not done or self.config.final_observation:
            steps_left = min(self.game.steps_left, self.max_turns - self.turns)
            observations.append(
                feedback_message(
                    result,
                    self.game.agent,
                    steps_left,
                    self.renderer,
                    inline=self.config.inline_images,
                )
            )
        return BaseTextEnvStepOutput(
            observations=cast(ConversationType, observations),
            reward=reward,
            done=done,
            metadata=metadata,
            postprocessed_action=None,
        )

    def _step_path(self, action: object) -> BaseTextEnvStepOutput:
        self.score = score_path(
            self.maze,
            action,
            self.reward_spec,
            step_budget=self.task.step_budget,
            max_chars=self.config.max_action_chars,
        )
        return BaseTextEnvStepOutput(
            observations=[],
            reward=self.score.reward,
            done=True,
            metadata={"score": self.score.to_dict(), "agent": list(self.score.final_pos)},
            postprocessed_action=None,
        )

    def get_metrics(self) -> dict[str, Any]:
        s = self.score
        if s is None:
            return {"turns": self.turns, "solved": False, "finished": False}
        return {
            "turns": s.turns,
            "solved": s.solved,
            "finished": True,
            "reward": s.reward,
            "moves": s.moves,
            "bumps": s.bumps,
            "invalid": s.invalid,
            "tag_fraction": s.tag_fraction,
            "efficiency": s.efficiency,
            "optimal_moves": s.optimal_moves,
        }
