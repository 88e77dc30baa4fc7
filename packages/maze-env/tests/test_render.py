import base64
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from maze_env import generate
from maze_env.render import (
    QWEN3_VL_TOKEN_PX,
    Renderer,
    Style,
    render_ascii,
    render_rgb,
    token_aligned_style,
)

MAZE = generate("easy", 0)  # start (7, 1), goal (1, 7), (0, 0) is wall, (3, 1) is path


def _centre(frame: np.ndarray, pos: tuple[int, int], px: int) -> tuple[int, ...]:
    return tuple(int(v) for v in frame[pos[0] * px + px // 2, pos[1] * px + px // 2])


def test_visgym_look() -> None:
    frame = render_rgb(MAZE)
    assert frame.shape == (225, 225, 3) and frame.dtype == np.uint8
    assert _centre(frame, (0, 0), 25) == (169, 169, 169)
    assert _centre(frame, (3, 1), 25) == (255, 255, 255)
    assert _centre(frame, MAZE.goal, 25) == (255, 0, 0)
    assert _centre(frame, MAZE.start, 25) == (0, 0, 255)
    # The disc has radius a quarter square: a square's corner keeps the path colour.
    r, c = MAZE.start
    assert tuple(int(v) for v in frame[r * 25 + 1, c * 25 + 1]) == (255, 255, 255)
    disc = (frame[r * 25 : (r + 1) * 25, c * 25 : (c + 1) * 25] == (0, 0, 255)).all(axis=2).sum()
    assert abs(disc - np.pi * 6.25**2) < 15


def test_agent_moves_and_stands_on_goal() -> None:
    renderer = Renderer(MAZE)
    moved = renderer.rgb((3, 1))
    assert _centre(moved, (3, 1), 25) == (0, 0, 255)
    assert _centre(moved, MAZE.start, 25) == (255, 255, 255)
    on_goal = renderer.rgb(MAZE.goal)
    gr, gc = MAZE.goal
    assert _centre(on_goal, MAZE.goal, 25) == (0, 0, 255)
    assert tuple(int(v) for v in on_goal[gr * 25 + 1, gc * 25 + 1]) == (255, 0, 0)
    # Frames are independent copies.
    assert _centre(renderer.rgb(), (3, 1), 25) == (255, 255, 255)


def test_token_aligned_cells() -> None:
    style = token_aligned_style()
    frame = Renderer(MAZE, style).rgb()
    assert style.cell_px == QWEN3_VL_TOKEN_PX == 32
    assert frame.shape == (9 * 32, 9 * 32, 3)
    # Every 32x32 token patch is a single grid square: uniform unless it holds the agent.
    for r in range(9):
        for c in range(9):
            patch = frame[r * 32 : (r + 1) * 32, c * 32 : (c + 1) * 32].reshape(-1, 3)
            if (r, c) != MAZE.start:
                assert (patch == patch[0]).all()


def test_png_and_data_uri_decode_to_the_frame() -> None:
    renderer = Renderer(MAZE, Style(cell_px=10))
    png = renderer.png((3, 1))
    assert png.startswith(b"\x89PNG")
    assert np.array_equal(
        np.asarray(Image.open(io.BytesIO(png)).convert("RGB")), renderer.rgb((3, 1))
    )
    uri = renderer.data_uri()
    assert uri.startswith("data:image/png;base64,")
    decoded = np.asarray(
        Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).convert("RGB")
    )
    assert np.array_equal(decoded, renderer.rgb())


def test_ascii_uses_visgym_symbols() -> None:
    text = render_ascii(MAZE).splitlines()
    assert len(text) == 9 and all(len(row) == 9 for row in text)
    assert text[7][1] == "A" and text[1][7] == "T" and text[0] == "#" * 9
    assert render_ascii(MAZE, (3, 1)).splitlines()[3][1] == "A"


def test_bad_cell_size_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="cell_px"):
        Style(cell_px=2)


def test_rendering_records_round_trip_and_bad_ones_are_named(tmp_path: Path) -> None:
    from maze_env import RENDERING_FILE, RenderingError, Style, read_rendering, write_rendering

    assert read_rendering(tmp_path) is None  # nothing recorded
    assert read_rendering(tmp_path / "absent.json") is None
    path = write_rendering(tmp_path, Style(cell_px=25))
    assert path == tmp_path / RENDERING_FILE
    assert read_rendering(tmp_path) == Style(cell_px=25) == read_rendering(path)
    data = tmp_path / "data"
    data.mkdir()
    (data / "mazerl_datasets.json").write_text('{"format": 2, "cell_px": 32, "train_size": 8}')
    assert read_rendering(data) == Style(cell_px=32)  # a dataset manifest records it too
    for bad in ('{"cell_px": "25"}', '{"cell_px": true}', '{"cell_px": 2}', "{}", "not json"):
        path.write_text(bad)
        with pytest.raises(RenderingError, match=RENDERING_FILE):
            read_rendering(tmp_path)
