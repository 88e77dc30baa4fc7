"""What every chart shares: matplotlib on the headless Agg backend, percent axes, small PNGs.

matplotlib is imported on first use, so importing ``maze_evaluation`` stays light.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weight_sync import fs

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

SOLVED = "#2e8b57"
FAILED = "#c0392b"
MUTED = "#777777"
RUN_COLOURS = ("#3b75af", "#ef8636")
"""Run A and run B in comparisons."""
KIND_COLOURS = {
    "solved": SOLVED,
    "wrong_stop": FAILED,
    "out_of_budget": "#e67e22",
    "unfinished": "#8e6c8a",
}


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display, no GUI toolkit)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def percent_axis(ax: Axes, axis: str = "y") -> None:
    """Show 0..1 as 0%..100% on ``axis``, with a little room at both ends."""
    from matplotlib.ticker import PercentFormatter

    target = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_ylim if axis == "y" else ax.set_xlim)(0, 1.08)
    target.set_major_formatter(PercentFormatter(1.0, decimals=0))


def kind_label(kind: str) -> str:
    """``out_of_budget`` -> ``out of budget``."""
    return kind.replace("_", " ")


def short(text: str, width: int = 28) -> str:
    """``text`` cut to ``width`` characters with an ellipsis, for titles and legends."""
    return text if len(text) <= width else text[: width - 3] + "..."


def save_png(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Write ``fig`` as a PNG, atomically (a viewer never reads half a file), and close it."""
    from PIL import Image

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png")
    finally:
        pyplot().close(fig)
    # A 256-colour palette keeps a chart's look at about a third of the RGBA size.
    buf.seek(0)
    with Image.open(buf) as im:
        small = im.convert("RGB").quantize(colors=256)
    out_buf = io.BytesIO()
    small.save(out_buf, format="PNG", optimize=True)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fs.atomic_write_bytes(out, out_buf.getvalue(), durable=False)
    return out
