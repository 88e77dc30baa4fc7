from maze_env import MazeGame, generate
from maze_env.prompts import oracle_reply

# Training data is built from these strings, so they are pinned character for character.
MOVE = (
    "<observation>I am at row 7, column 1. The goal is at row 1, column 7.</observation>"
    "<justification>Moving right follows the shortest path to the goal.</justification>"
    "<action>right</action>"
)
STOP = (
    "<observation>I am at row 1, column 7. The goal is at row 1, column 7.</observation>"
    "<justification>I am on the goal, so I stop.</justification>"
    "<action>stop</action>"
)


def test_oracle_reply_text_is_pinned() -> None:
    assert oracle_reply((7, 1), (1, 7), "right") == MOVE
    assert oracle_reply((1, 7), (1, 7), "stop") == STOP


def test_oracle_replies_solve_the_maze() -> None:
    maze = generate("easy", 0)
    game = MazeGame.start(maze)
    for word in [d.word for d in maze.optimal_actions] + ["stop"]:
        game.step(oracle_reply(game.agent, maze.goal, word))
    assert game.solved
