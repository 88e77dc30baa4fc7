import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from maze_evaluation import (
    EndpointBackend,
    EvalRecord,
    Identity,
    Job,
    Played,
    ResultsFileError,
    compare_figure,
    compare_lines,
    episode_differences,
    evaluate,
    read_records,
    report_figure,
    series_figure,
    write_compare,
    write_gif,
    write_report,
    write_series_chart,
)
from maze_evaluation.testing import ScriptedServer
from maze_policy.sampling import SamplingParams

SET = "small-64"
N = 6
STABLE = (
    "eval_set",
    "seed",
    "sample",
    "solved",
    "reward",
    "turns",
    "moves",
    "path",
    "replies",
    "failure",
)


class KilledError(Exception):
    pass


class StopAfter:
    """Wraps a backend and dies after ``n`` finished episodes, as a killed run would."""

    def __init__(self, inner: EndpointBackend, n: int) -> None:
        self.inner = inner
        self.n = n

    @property
    def identity(self) -> Identity:
        return self.inner.identity

    def play(
        self, jobs: Sequence[Job], sampling: SamplingParams, on_done: Callable[[Played], None]
    ) -> None:
        seen = 0

        def counted(p: Played) -> None:
            nonlocal seen
            if seen == self.n:
                raise KilledError
            on_done(p)
            seen += 1

        self.inner.play(jobs, sampling, counted)


def stable(recs: Sequence[EvalRecord]) -> list[dict[str, Any]]:
    return [{k: asdict(r)[k] for k in STABLE} for r in recs]


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as srv:
        yield srv


def test_resume_after_interruption_gives_the_same_records(
    server: ScriptedServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    full = evaluate(
        EndpointBackend(server.url, "looper"),
        eval_set=SET,
        limit=N,
        out=tmp_path / "full.jsonl",
        progress=False,
    )
    out = tmp_path / "part.jsonl"
    with pytest.raises(KilledError):
        evaluate(
            StopAfter(EndpointBackend(server.url, "looper"), 3),
            eval_set=SET,
            limit=N,
            out=out,
            progress=False,
        )
    partial = {r.key for r in read_records(out)}
    assert len(partial) == 3
    with out.open("a") as f:
        f.write('{"eval_set": "small-64", "seed": 9')  # a write torn by a kill
    with pytest.raises(ResultsFileError, match="already exists"):
        evaluate(
            EndpointBackend(server.url, "looper"), eval_set=SET, limit=N, out=out, progress=False
        )
    srv_before = server.requests
    resumed = evaluate(
        EndpointBackend(server.url, "looper"),
        eval_set=SET,
        limit=N,
        out=out,
        resume=True,
        progress=False,
    )
    assert "torn last line" in caplog.text
    assert stable(resumed) == stable(full)
    assert stable(sorted(read_records(out), key=lambda r: r.key)) == stable(full)
    # Only the 3 missing episodes were played again.
    assert server.requests - srv_before == sum(r.turns for r in full if r.key not in partial)


def test_corrupt_middle_line_names_file_and_line(server: ScriptedServer, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    evaluate(EndpointBackend(server.url, "stopper"), eval_set=SET, limit=3, out=out, progress=False)
    lines = out.read_text().splitlines()
    out.write_text("\n".join([lines[0], "not json", *lines[1:]]) + "\n")
    with pytest.raises(ResultsFileError, match=r"r\.jsonl: line 2"):
        read_records(out)


def test_resume_refuses_results_of_another_eval_set(server: ScriptedServer, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    evaluate(EndpointBackend(server.url, "stopper"), eval_set=SET, limit=2, out=out, progress=False)
    with pytest.raises(ResultsFileError, match="easy-64"):
        evaluate(
            EndpointBackend(server.url, "stopper"),
            eval_set="easy-64",
            limit=2,
            out=out,
            resume=True,
            progress=False,
        )
    with pytest.raises(ResultsFileError, match="same backend, model, adapter and context"):
        evaluate(
            EndpointBackend(server.url, "oracle"),
            eval_set=SET,
            limit=2,
            out=out,
            resume=True,
            progress=False,
        )


def test_compare_report_and_gif(server: ScriptedServer, tmp_path: Path) -> None:
    good = evaluate(EndpointBackend(server.url, "oracle"), eval_set=SET, limit=N, progress=False)
    bad = evaluate(EndpointBackend(server.url, "bumper"), eval_set=SET, limit=N, progress=False)
    lines = compare_lines(good, bad, ("oracle", "bumper"))
    text = "\n".join(lines)
    assert "100.00%" in text and "0.00%" in text
    assert f"per-maze differences: {N} (solved only in oracle: {N}, only in bumper: 0)" in text
    assert sum("-> out_of_budget/0m" in line for line in lines) == N

    assert episode_differences(good, list(good)) == []
    diffs = episode_differences(good, bad[1:])
    assert diffs[0] == ((0, 0), "missing")
    assert {f for _, f in diffs[1:]} == {
        "solved",
        "reward",
        "failure",
        "turns",
        "moves",
        "path",
        "replies",
    }
    mixed = good[: N // 2] + bad[N // 2 :]
    png = write_report(mixed, tmp_path / "report.png")
    _assert_png(png, width=(700, 1200), height=(500, 1400))
    # Two chart panels, then one thumbnail per failed maze, captioned with seed and outcome.
    fig = report_figure(mixed, columns=4)
    thumbs = fig.axes[2:]
    assert len(fig.axes) == 2 + N - N // 2
    assert [ax.get_title().splitlines()[0] for ax in thumbs] == [
        f"seed {r.seed}: out of budget" for r in bad[N // 2 :]
    ]
    assert fig.axes[0].get_xticklabels()[0].get_text() == str(mixed[0].optimal_moves)
    assert len(report_figure(good).axes) == 2  # nothing failed: no grid
    cmp_png = write_compare(good, mixed, tmp_path / "compare.png", ("oracle", "mixed"))
    _assert_png(cmp_png, width=(1000, 1400), height=(300, 600))
    fig = compare_figure(good, mixed, ("oracle", "mixed"))
    assert len(fig.axes) == 3
    # Per-episode changes: solved in both, only in A, only in B, in neither.
    assert [t.get_text() for t in fig.axes[2].texts] == [str(N // 2), str(N - N // 2), "0", "0"]
    import matplotlib.pyplot as plt

    plt.close("all")
    looped = evaluate(EndpointBackend(server.url, "oracle"), eval_set=SET, limit=1, progress=False)[
        0
    ]
    gif = write_gif(looped, tmp_path / "ep.gif", cell_px=16)
    with Image.open(gif) as im:
        assert im.format == "GIF" and getattr(im, "n_frames", 1) == len(looped.path)
        assert im.size == (7 * 16, 7 * 16)


def _assert_png(path: Path, *, width: tuple[int, int], height: tuple[int, int]) -> None:
    with Image.open(path) as im:
        im.load()
        assert im.format == "PNG"
        assert width[0] <= im.width <= width[1] and height[0] <= im.height <= height[1]
    assert path.stat().st_size < 150_000


def test_series_chart_has_a_point_per_version(tmp_path: Path) -> None:
    entries = [
        {"version": v, "step": 10 * v, "eval_set": SET, "episodes": 64, "solve_rate": r,
         "ci95": [max(0.0, r - 0.1), min(1.0, r + 0.1)], "pass_at": {"1": r}}
        for v, r in ((1, 0.25), (2, 0.5), (3, 0.75))
    ]  # fmt: skip
    png = write_series_chart(entries, tmp_path / "series.png")
    _assert_png(png, width=(600, 900), height=(300, 500))
    fig = series_figure(entries)
    assert len(fig.axes) == 1
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [
        "v1\nstep 10", "v2\nstep 20", "v3\nstep 30",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="no evaluated versions"):
        series_figure([])
    import matplotlib.pyplot as plt

    plt.close("all")


def test_record_json_round_trips(server: ScriptedServer, tmp_path: Path) -> None:
    recs = evaluate(
        EndpointBackend(server.url, "garbage"),
        eval_set=SET,
        limit=1,
        out=tmp_path / "r.jsonl",
        progress=False,
    )
    line = (tmp_path / "r.jsonl").read_text().splitlines()[0]
    assert json.loads(line) == json.loads(recs[0].to_json())
    assert read_records(tmp_path / "r.jsonl") == recs
