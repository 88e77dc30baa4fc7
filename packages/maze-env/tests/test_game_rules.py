import pytest

from maze_env import (
    Action,
    Direction,
    EpisodeOverError,
    EvalSetError,
    MazeEnvError,
    MazeGame,
    MazeSpecError,
    generate,
)
from maze_env.game import FEEDBACK_MOVED, FEEDBACK_WALL

# easy seed 0: start (7, 1), goal (1, 7); up from the start is a wall, right is open.
MAZE = generate("easy", 0)


def test_optimal_play_solves_with_reward_one() -> None:
    game = MazeGame.start(MAZE)
    for d in MAZE.optimal_actions:
        result = game.step(Action.move(d))
        assert result.outcome == "moved" and result.reward == 0.0 and not result.terminated
    assert game.agent == MAZE.goal
    result = game.step("('stop', 'stop')")
    assert result.terminated and result.reward == 1.0 and game.solved
    assert game.steps_used == MAZE.optimal_moves + 1
    with pytest.raises(EpisodeOverError, match="over"):
        game.step("up")


def test_errors_share_one_root_and_keep_their_builtin_bases() -> None:
    # Callers that caught ValueError or RuntimeError before the root existed still catch them.
    for err, builtin in (
        (MazeSpecError, ValueError),
        (EvalSetError, ValueError),
        (EpisodeOverError, RuntimeError),
    ):
        assert issubclass(err, MazeEnvError) and issubclass(err, builtin)


def test_wall_bump_is_a_noop_that_uses_a_step() -> None:
    game = MazeGame.start(MAZE)
    result = game.step("<action>up</action>")
    assert result.outcome == "bumped" and result.feedback == FEEDBACK_WALL
    assert game.agent == MAZE.start and game.steps_used == 1
    assert game.step("right").feedback == FEEDBACK_MOVED


def test_unparseable_text_is_a_noop_with_feedback_and_uses_a_step() -> None:
    game = MazeGame.start(MAZE)
    result = game.step("I am not sure")
    assert result.outcome == "invalid" and result.failure is not None
    assert result.failure.code == "no_action"
    assert "Invalid action" in result.feedback
    assert game.agent == MAZE.start and game.steps_used == 1 and not game.done


def test_stop_away_from_goal_ends_with_zero() -> None:
    game = MazeGame.start(MAZE)
    result = game.step("stop")
    assert result.terminated and result.reward == 0.0 and not game.solved


def test_reaching_goal_without_stop_does_not_end() -> None:
    game = MazeGame.start(MAZE, step_budget=100)
    for d in MAZE.optimal_actions:
        game.step(Action.move(d))
    assert game.agent == MAZE.goal and not game.done
    back = Direction((MAZE.optimal_actions[-1] + 2) % 4)
    game.step(Action.move(back))
    assert game.agent != MAZE.goal and not game.done


def test_budget_truncates() -> None:
    game = MazeGame.start(MAZE, step_budget=3)
    results = [game.step("up") for _ in range(3)]
    assert [r.truncated for r in results] == [False, False, True]
    assert results[-1].reward == 0.0 and not results[-1].terminated
    assert "budget" in results[-1].feedback


def test_stop_on_last_turn_terminates_rather_than_truncates() -> None:
    game = MazeGame.start(MAZE, step_budget=MAZE.optimal_moves + 1)
    for d in MAZE.optimal_actions:
        game.step(Action.move(d))
    result = game.step("stop")
    assert result.terminated and not result.truncated and result.reward == 1.0


def test_default_budget_always_suffices_and_bad_budget_is_refused() -> None:
    for seed in range(20):
        maze = generate("hard", seed)
        game = MazeGame.start(maze, slack=0)
        for d in maze.optimal_actions:
            game.step(Action.move(d))
        assert game.step("stop").reward == 1.0
    with pytest.raises(ValueError, match="step_budget"):
        MazeGame.start(MAZE, step_budget=0)
