"""Chat messages for a maze episode, in the OpenAI format that SkyRL, vLLM and TRL accept.

One place builds them, so dataset export, the RL environment and evaluators show a model
exactly the same text and images. Images are PNG data URIs (``image_url`` parts), the form that
survives serialisation; with ``inline=True`` they are PIL images (``image`` parts) instead, for
a consumer in the same process that would only decode the PNG again (same pixels, no encode,
no decode). Inline messages must not leave the process.
"""

from __future__ import annotations

from typing import Any

from PIL import Image

from maze_env.game import StepResult
from maze_env.maze import Maze, Pos
from maze_env.render import DEFAULT_STYLE, Renderer, Style

Message = dict[str, Any]

SYSTEM_PROMPT = (
    "You are navigating a maze shown as an image. Walls are gray, paths are white, you are the "
    "blue circle and the goal is the red square. Each turn, choose exactly one action: move "
    "right, up, left or down by one square, or stop. Stop only when you are on the red square.\n"
    "Answer in this format:\n"
    "<observation>what you see: your position, the goal, nearby walls</observation>\n"
    "<justification>why this action brings you closer to the goal</justification>\n"
    "<action>one of: right, up, left, down, stop</action>\n"
    "VisGym tuples are also accepted inside the action tag: ('move', k) with k 0=right, 1=up, "
    "2=left, 3=down, or ('stop', 'stop')."
)


def image_part(data_uri: str) -> dict[str, Any]:
    """An OpenAI ``image_url`` content part holding ``data_uri``."""
    return {"type": "image_url", "image_url": {"url": data_uri}}


def inline_image_part(image: Image.Image) -> dict[str, Any]:
    """A content part holding a PIL image itself (in-process consumers only)."""
    return {"type": "image", "image": image}


def _image(renderer: Renderer, agent: Pos | None, inline: bool) -> dict[str, Any]:
    if inline:
        return inline_image_part(renderer.image(agent))
    return image_part(renderer.data_uri(agent))


def text_part(text: str) -> dict[str, Any]:
    """An OpenAI ``text`` content part."""
    return {"type": "text", "text": text}


def task_text(maze: Maze, step_budget: int) -> str:
    """The first user turn's text: the maze size and the turn budget."""
    rows, cols = maze.shape
    return (
        f"Here is a {rows}x{cols} maze. You have {step_budget} turns, including the final stop. "
        "What is your first action?"
    )


def oracle_reply(agent: Pos, goal: Pos, action: str) -> str:
    """The oracle's answer in VisGym's SFT format for ``action`` taken at ``agent``."""
    where = (
        f"<observation>I am at row {agent[0]}, column {agent[1]}. "
        f"The goal is at row {goal[0]}, column {goal[1]}.</observation>"
    )
    if action == "stop":
        why = "<justification>I am on the goal, so I stop.</justification>"
    else:
        why = (
            f"<justification>Moving {action} follows the shortest path to the goal.</justification>"
        )
    return f"{where}{why}{action_reply(action)}"


def action_reply(action: str) -> str:
    """The shortest well-formed answer: the action tag alone (``<action>up</action>``)."""
    return f"<action>{action}</action>"


def initial_messages(
    maze: Maze,
    step_budget: int,
    *,
    style: Style = DEFAULT_STYLE,
    renderer: Renderer | None = None,
    system_prompt: str = SYSTEM_PROMPT,
    inline: bool = False,
) -> list[Message]:
    """System prompt plus the first user turn: the task text and the maze image."""
    r = renderer or Renderer(maze, style)
    return [
        {"role": "system", "content": system_prompt},
        {
            "role": "user",
            "content": [_image(r, None, inline), text_part(task_text(maze, step_budget))],
        },
    ]


def feedback_message(
    result: StepResult, agent: Pos, steps_left: int, renderer: Renderer, *, inline: bool = False
) -> Message:
    """The user turn after an action: the environment's feedback and the new image."""
    text = f"{result.feedback} Turns left: {steps_left}."
    if not (result.terminated or result.truncated):
        text += " What is your next action?"
    return {"role": "user", "content": [_image(renderer, agent, inline), text_part(text)]}
