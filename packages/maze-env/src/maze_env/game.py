"""Episode rules, shared by the Gymnasium env, the RL env and evaluators.

Semantics follow VisGym's ``maze_2d``: every turn uses one step of the budget, including
invalid ones; moving into a wall or sending unparseable text is a no-op with feedback;
``stop`` ends the episode with reward 1 on the goal and 0 elsewhere; reaching the goal without
``stop`` does not end it; running out of budget truncates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from maze_env.actions import DIRECTION_DELTAS, Action, ParseFailure, parse_action
from maze_env.errors import EpisodeOverError
from maze_env.maze import DEFAULT_SLACK, Maze, Pos

Outcome = Literal["moved", "bumped", "invalid", "stopped"]

FEEDBACK_MOVED = "Action executed successfully."
FEEDBACK_WALL = "Cannot move into a wall."
FEEDBACK_STOP_GOAL = "You stopped on the target. Success."
FEEDBACK_STOP_ELSEWHERE = "You stopped away from the target. Episode over."
FEEDBACK_BUDGET = "Step budget exhausted."


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one turn did: outcome, feedback shown to the model, reward, end flags, parsed action."""

    outcome: Outcome
    feedback: str
    reward: float
    terminated: bool
    truncated: bool
    action: Action | None
    failure: ParseFailure | None = None


@dataclass
class MazeGame:
    """Mutable episode state over an immutable :class:`Maze`."""

    maze: Maze
    step_budget: int = 0
    agent: Pos = (0, 0)
    steps_used: int = 0
    terminated: bool = False
    truncated: bool = False
    reward: float = 0.0
    trajectory: list[Pos] = field(default_factory=list[Pos])

    @classmethod
    def start(
        cls, maze: Maze, step_budget: int | None = None, slack: int = DEFAULT_SLACK
    ) -> MazeGame:
        budget = maze.step_budget(slack) if step_budget is None else step_budget
        if budget < 1:
            raise ValueError(f"step_budget must be >= 1, got {budget}")
        return cls(maze=maze, step_budget=budget, agent=maze.start, trajectory=[maze.start])

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    @property
    def solved(self) -> bool:
        return self.terminated and self.reward > 0

    @property
    def steps_left(self) -> int:
        return self.step_budget - self.steps_used

    def step(self, action: Action | ParseFailure | str) -> StepResult:
        """Apply one turn and report what it did.

        ``action`` may be raw model text (parsed here) or an already parsed result, so callers
        with their own length cap can pass a :class:`ParseFailure` through.
        """
        if self.done:
            raise EpisodeOverError("episode is over; start a new game")
        failure: ParseFailure | None = None
        parsed = parse_action(action) if isinstance(action, str) else action
        self.steps_used += 1
        if isinstance(parsed, ParseFailure):
            failure, act = parsed, None
            outcome: Outcome = "invalid"
            feedback = f"Invalid action: {parsed.reason}. Nothing was executed."
        elif parsed.kind == "stop":
            act = parsed
            outcome = "stopped"
            self.terminated = True
            self.reward = 1.0 if self.agent == self.maze.goal else 0.0
            feedback = FEEDBACK_STOP_GOAL if self.reward else FEEDBACK_STOP_ELSEWHERE
        else:
            act = parsed
            assert parsed.direction is not None
            dr, dc = DIRECTION_DELTAS[parsed.direction]
            nxt = (self.agent[0] + dr, self.agent[1] + dc)
            if self.maze.is_open(nxt):
                self.agent = nxt
                self.trajectory.append(nxt)
                outcome, feedback = "moved", FEEDBACK_MOVED
            else:
                outcome, feedback = "bumped", FEEDBACK_WALL
        if not self.terminated and self.steps_used >= self.step_budget:
            self.truncated = True
            feedback = f"{feedback} {FEEDBACK_BUDGET}"
        return StepResult(
            outcome=outcome,
            feedback=feedback,
            reward=self.reward if self.terminated else 0.0,
            terminated=self.terminated,
            truncated=self.truncated,
            action=act,
            failure=failure,
        )
