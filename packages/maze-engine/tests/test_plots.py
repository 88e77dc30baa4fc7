"""curves.png from metrics.jsonl: merged steps, a panel each, KL named when not logged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from maze_engine.errors import MetricsFileError
from maze_engine.plots import curves_figure, read_metrics, write_curves


def _row(step: int, **extra: float) -> dict[str, Any]:
    return {
        "global_step": step,
        "policy/policy_entropy": 0.06 - step * 0.001,
        "reward/avg_raw_reward": 0.4 + step * 0.01,
        "reward/avg_pass_at_1": 0.4 + step * 0.01,
        "reward/avg_pass_at_8": 0.9,
        "timing/generate": 2.5,
        "timing/policy_train": 4.0,
        "timing/sync_weights": 0.02,
        "timing/step": 6.7,
        **extra,
    }


def _write(path: Path, rows: list[dict[str, Any]], tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def test_rows_merge_per_step_and_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    rows = [{"global_step": 0, "eval/all/pass_at_1": 0.5}, _row(1), _row(2)]
    # A resumed run appends again from its checkpoint; the final eval shares the last step.
    rows += [_row(2, **{"timing/step": 9.0}), {"global_step": 2, "eval/all/pass_at_1": 0.75}]
    _write(tmp_path / "metrics.jsonl", rows, tail='{"global_step": 3, "rew')
    merged = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["global_step"] for r in merged] == [0, 1, 2]
    assert merged[2]["timing/step"] == 9.0 and merged[2]["eval/all/pass_at_1"] == 0.75
    assert "reward/avg_raw_reward" not in merged[0]


def test_bad_or_missing_metrics_are_one_error(tmp_path: Path) -> None:
    with pytest.raises(MetricsFileError, match="cannot read the metrics file"):
        read_metrics(tmp_path / "metrics.jsonl")
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(MetricsFileError, match="no metrics rows yet"):
        read_metrics(tmp_path / "metrics.jsonl")
    (tmp_path / "metrics.jsonl").write_text('not json\n{"global_step": 1}\n')
    with pytest.raises(MetricsFileError, match="line 1 is not a metrics row"):
        read_metrics(tmp_path / "metrics.jsonl")


def test_curves_png_has_four_panels_and_a_kl_axis_only_when_logged(tmp_path: Path) -> None:
    rows = [{"global_step": 0, "eval/all/pass_at_1": 0.5}]
    rows += [_row(s) for s in range(1, 11)]
    rows[-1]["eval/all/pass_at_1"] = 0.7
    rows[5]["timing/save_checkpoint"] = 0.4
    _write(tmp_path / "metrics.jsonl", rows)
    png = write_curves(tmp_path)
    assert png == tmp_path / "curves.png"
    with Image.open(png) as im:
        im.load()
        assert im.format == "PNG" and 800 <= im.width <= 1400 and 500 <= im.height <= 1000
    assert png.stat().st_size < 120_000

    merged = read_metrics(tmp_path / "metrics.jsonl")
    fig = curves_figure(merged)
    titles = [ax.get_title() for ax in fig.axes]
    assert len(fig.axes) == 4
    assert "KL not logged" in titles[2]
    with_kl = [{**r, "policy/policy_kl": 0.001} if "timing/step" in r else r for r in merged]
    fig = curves_figure(with_kl)
    assert len(fig.axes) == 5  # the KL's own y axis on the policy panel
    assert fig.axes[2].get_title() == "policy entropy and KL to the base"
    import matplotlib.pyplot as plt

    plt.close("all")
