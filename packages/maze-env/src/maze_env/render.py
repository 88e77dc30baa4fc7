"""Rendering in pure numpy + pillow: RGB arrays, PNG bytes, data URIs and ASCII.

The default look is VisGym's: 25 px per grid square, white paths, gray walls, a red goal
square and a blue agent disc of radius a quarter square. ``cell_px=32`` aligns every grid
square with one Qwen3-VL visual token (16 px patches merged 2x2).
"""

from __future__ import annotations

import base64
import io
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import numpy.typing as npt
from PIL import Image

from maze_env.errors import RenderingError
from maze_env.maze import Maze, Pos

RGB = tuple[int, int, int]
Frame = npt.NDArray[np.uint8]

VISGYM_CELL_PX = 25
QWEN3_VL_TOKEN_PX = 32
"""Pixels per Qwen3-VL visual token: patch 16 x spatial merge 2."""


@dataclass(frozen=True, slots=True)
class Style:
    """Square size in pixels and colours of a rendered maze; the defaults are VisGym's."""

    cell_px: int = VISGYM_CELL_PX
    path: RGB = (255, 255, 255)
    wall: RGB = (169, 169, 169)
    goal: RGB = (255, 0, 0)
    agent: RGB = (0, 0, 255)

    def __post_init__(self) -> None:
        if not 4 <= self.cell_px <= 256:
            raise ValueError(f"cell_px must be within 4..256, got {self.cell_px}")


DEFAULT_STYLE = Style()


def token_aligned_style(token_px: int = QWEN3_VL_TOKEN_PX) -> Style:
    """One grid square per visual token, so no token straddles a wall boundary."""
    return Style(cell_px=token_px)


@lru_cache(maxsize=64)
def _disc(cell_px: int) -> npt.NDArray[np.bool_]:
    # Pixel centres within a quarter square of the square's centre, as pygame.draw.circle fills.
    coords = np.arange(cell_px) + 0.5
    d2 = (coords[:, None] - cell_px / 2) ** 2 + (coords[None, :] - cell_px / 2) ** 2
    return d2 <= (cell_px / 4) ** 2


@lru_cache(maxsize=64)
def _agent_stamp(style: Style, on_goal: bool) -> Frame:
    # The agent's square, pre-drawn: the agent only ever stands on a path or the goal, so two
    # stamps cover every frame and a step costs one slice copy instead of a masked write.
    stamp = np.empty((style.cell_px, style.cell_px, 3), dtype=np.uint8)
    stamp[...] = style.goal if on_goal else style.path
    stamp[_disc(style.cell_px)] = style.agent
    stamp.setflags(write=False)
    return stamp


@lru_cache(maxsize=64)
def _palette(style: Style) -> npt.NDArray[np.void]:
    # Square codes 0 path, 1 wall, 2 goal: one gather paints the whole small grid. Each colour
    # is one 3-byte item, so widening repeats items instead of separate channel bytes.
    palette = np.array([style.path, style.wall, style.goal], dtype=np.uint8).view("V3")[:, 0]
    palette.setflags(write=False)
    return palette


class Renderer:
    """Renders one maze repeatedly; the static layer is drawn once and copied per frame."""

    __slots__ = ("_base", "maze", "style")

    def __init__(self, maze: Maze, style: Style = DEFAULT_STYLE) -> None:
        self.maze = maze
        self.style = style
        px = style.cell_px
        codes = maze.walls.astype(np.uint8)
        codes[maze.goal] = 2
        squares = _palette(style)[codes]
        # Widen columns first, then rows: repeating whole rows is a contiguous copy.
        wide = squares.repeat(px, axis=1).repeat(px, axis=0)
        self._base: Frame = wide.view(np.uint8).reshape(*wide.shape, 3)

    def rgb(self, agent: Pos | None = None) -> Frame:
        """An (H, W, 3) uint8 frame with the agent at ``agent`` (the maze start by default)."""
        frame = self._base.copy()
        r, c = self.maze.start if agent is None else agent
        px = self.style.cell_px
        on_goal = (r, c) == self.maze.goal
        frame[r * px : (r + 1) * px, c * px : (c + 1) * px] = _agent_stamp(self.style, on_goal)
        return frame

    def image(self, agent: Pos | None = None) -> Image.Image:
        """The frame as a PIL RGB image, for consumers in this process (no PNG round trip)."""
        return Image.fromarray(self.rgb(agent), mode="RGB")

    def png(self, agent: Pos | None = None) -> bytes:
        return frame_to_png(self.rgb(agent))

    def data_uri(self, agent: Pos | None = None) -> str:
        return png_to_data_uri(self.png(agent))


def frame_to_png(frame: Frame) -> bytes:
    """PNG bytes of an (H, W, 3) uint8 frame."""
    buf = io.BytesIO()
    # compress_level 1: these flat-colour frames compress well even at the fastest level.
    Image.fromarray(frame, mode="RGB").save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def png_to_data_uri(png: bytes) -> str:
    """A ``data:image/png;base64,...`` URI, the form chat image parts carry."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def render_rgb(maze: Maze, agent: Pos | None = None, style: Style = DEFAULT_STYLE) -> Frame:
    """One frame of ``maze``; use a :class:`Renderer` to draw the same maze repeatedly."""
    return Renderer(maze, style).rgb(agent)


def render_png(maze: Maze, agent: Pos | None = None, style: Style = DEFAULT_STYLE) -> bytes:
    """One frame of ``maze`` as PNG bytes."""
    return Renderer(maze, style).png(agent)


def render_data_uri(maze: Maze, agent: Pos | None = None, style: Style = DEFAULT_STYLE) -> str:
    """One frame of ``maze`` as a PNG data URI."""
    return Renderer(maze, style).data_uri(agent)


def render_ascii(maze: Maze, agent: Pos | None = None) -> str:
    """VisGym's ANSI text view: ``#`` wall, space path, ``A`` agent, ``T`` target."""
    rows = [["#" if w else " " for w in row] for row in maze.walls.tolist()]
    gr, gc = maze.goal
    rows[gr][gc] = "T"
    ar, ac = maze.start if agent is None else agent
    rows[ar][ac] = "A"
    return "\n".join("".join(row) for row in rows)


RENDERING_FILE = "maze_rendering.json"
"""Beside an adapter: the rendering its training mazes had, so evaluation and serving match it."""
DATASET_MANIFEST = "mazerl_datasets.json"
"""The dataset manifest maze-engine writes beside exported datasets (it records ``cell_px``)."""


def write_rendering(directory: str | os.PathLike[str], style: Style) -> Path:
    """Record ``style``'s square size in ``directory/maze_rendering.json`` (atomically)."""
    from weight_sync.fs import atomic_write_json

    path = Path(directory) / RENDERING_FILE
    atomic_write_json(path, {"cell_px": style.cell_px})
    return path


def read_rendering(path: str | os.PathLike[str]) -> Style | None:
    """The rendering recorded at ``path``; None when nothing is recorded there.

    ``path`` is a ``maze_rendering.json`` or a dataset manifest (``mazerl_datasets.json``), or a
    directory holding either (an adapter directory, a dataset directory).

    Raises:
        RenderingError: The file exists but is not JSON with a valid ``cell_px``.
    """
    p = Path(path)
    if p.is_dir():
        p = next((p / n for n in (RENDERING_FILE, DATASET_MANIFEST) if (p / n).is_file()), p)
        if p.is_dir():
            return None
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text())
        cell_px = data["cell_px"]
        if not isinstance(cell_px, int) or isinstance(cell_px, bool):
            raise TypeError(f"cell_px is {cell_px!r}")
        return Style(cell_px=cell_px)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RenderingError(
            f"{p}: not a rendering record with an integer cell_px: {exc}"
        ) from None
