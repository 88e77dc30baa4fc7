"""The maze as a ``gymnasium.Env``; importing this module registers its ids.

Ids: ``mazerl/Maze-v0`` (``preset=`` any spec, default ``easy``), ``mazerl/MazeEasy-v0`` and
``mazerl/MazeHard-v0``. Without importing first: ``gymnasium.make("maze_env.env:mazerl/Maze-v0")``.

Actions are ``Discrete(5)`` (0 right, 1 up, 2 left, 3 down, 4 stop) so Gymnasium tooling can
sample them; ``step`` also takes an :class:`Action` or raw model text, parsed as VisGym does.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from maze_env.actions import Action, Direction
from maze_env.game import MazeGame, StepResult
from maze_env.maze import DEFAULT_SLACK, Maze, MazeSpec, generate_from
from maze_env.render import DEFAULT_STYLE, Frame, Renderer, Style, render_ascii

STOP_ACTION = 4


_CODES: tuple[Action, ...] = (*(Action.move(d) for d in Direction), Action.stop())


def _to_action(action: Any) -> Action | str:
    if type(action) is int or isinstance(action, np.integer):
        code = int(action)  # pyright: ignore[reportUnknownArgumentType]
        if 0 <= code <= STOP_ACTION:
            return _CODES[code]
    elif isinstance(action, Action | str):
        return action
    raise gym.error.InvalidAction(f"action must be 0-4, an Action or text, got {action!r}")


class MazeEnv(gym.Env[Frame, Any]):
    """The maze as a Gymnasium env: RGB frames; actions 0-4, an :class:`Action` or model text."""

    metadata: dict[str, Any] = {"render_modes": ["rgb_array", "ansi"], "render_fps": 4}  # noqa: RUF012

    def __init__(
        self,
        preset: str | MazeSpec = "easy",
        *,
        render_mode: str | None = "rgb_array",
        cell_px: int = DEFAULT_STYLE.cell_px,
        slack: int = DEFAULT_SLACK,
        step_budget: int | None = None,
    ) -> None:
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}"
            )
        self.spec_ = preset if isinstance(preset, MazeSpec) else MazeSpec.parse(preset)
        self.render_mode = render_mode
        self.style = Style(cell_px=cell_px)
        self.slack = slack
        self.fixed_budget = step_budget
        h, w = self.spec_.rows * cell_px, self.spec_.cols * cell_px
        self.observation_space = spaces.Box(0, 255, shape=(h, w, 3), dtype=np.uint8)
        self.action_space = spaces.Discrete(5)
        self._game: MazeGame | None = None
        self._renderer: Renderer | None = None
        self._last: StepResult | None = None

    @property
    def game(self) -> MazeGame:
        if self._game is None:
            raise gym.error.ResetNeeded("call reset() before using the environment")
        return self._game

    @property
    def maze(self) -> Maze:
        return self.game.maze

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Frame, dict[str, Any]]:
        """Start an episode on a new maze.

        ``seed`` picks the VisGym-identical layout; with no seed, the env's own generator
        (seeded by the first ``reset(seed=...)``) draws one, as Gymnasium envs do.

        ``options``: ``maze`` (a :class:`Maze` to play as is), ``step_budget`` (int).
        """
        super().reset(seed=seed)
        opts = options or {}
        maze = opts.get("maze")
        if maze is None:
            # super().reset re-seeded np_random from ``seed``, exactly as VisGym does; drawing the
            # maze from it keeps seeded and successive unseeded resets identical to VisGym's.
            maze = generate_from(self.spec_, self.np_random, seed)
        elif not isinstance(maze, Maze):
            raise TypeError(f"options['maze'] must be a Maze, got {type(maze).__name__}")
        elif maze.shape != (self.spec_.rows, self.spec_.cols):
            raise ValueError(
                f"options['maze'] is {maze.shape}, this env renders {(self.spec_.rows, self.spec_.cols)}"
            )
        budget = opts.get("step_budget", self.fixed_budget)
        self._game = MazeGame.start(maze, step_budget=budget, slack=self.slack)
        self._renderer = Renderer(maze, self.style)
        self._last = None
        return self._renderer.rgb(), self._info()

    def step(self, action: Any) -> tuple[Frame, SupportsFloat, bool, bool, dict[str, Any]]:
        game = self.game
        self._last = game.step(_to_action(action))
        assert self._renderer is not None
        obs = self._renderer.rgb(game.agent)
        return obs, self._last.reward, self._last.terminated, self._last.truncated, self._info()

    def render(self) -> Any:
        if self.render_mode == "ansi":
            return render_ascii(self.game.maze, self.game.agent)
        if self.render_mode == "rgb_array":
            assert self._renderer is not None
            return self._renderer.rgb(self.game.agent)
        return None

    def _info(self) -> dict[str, Any]:
        game = self.game
        (ar, ac), (gr, gc) = game.agent, game.maze.goal
        info: dict[str, Any] = {
            "seed": game.maze.seed,
            "agent": game.agent,
            "goal": game.maze.goal,
            "distance": abs(ar - gr) + abs(ac - gc),  # L1, as VisGym reports
            "optimal_moves": game.maze.optimal_moves,
            "step_budget": game.step_budget,
            "steps_used": game.steps_used,
        }
        if self._last is not None:
            info["outcome"] = self._last.outcome
            info["env_feedback"] = self._last.feedback
            if self._last.failure is not None:
                info["parse_failure"] = self._last.failure.code
        return info


ENV_IDS = ("mazerl/Maze-v0", "mazerl/MazeEasy-v0", "mazerl/MazeHard-v0")


def register_envs() -> None:
    """Register the Gymnasium ids (idempotent)."""
    for env_id, kwargs in zip(ENV_IDS, ({}, {"preset": "easy"}, {"preset": "hard"}), strict=True):
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point="maze_env.env:MazeEnv", kwargs=kwargs)


register_envs()
