"""The maze-verifier CLI, run as a real process over real files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from maze_env import generate


def _run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "maze_verifier.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_score_file_with_good_and_bad_lines(tmp_path: Path) -> None:
    maze = generate("easy", 3)
    turns = [f"<action>{d.word}</action>" for d in maze.optimal_actions] + ["<action>stop</action>"]
    letters = "".join(d.word[0] for d in maze.optimal_actions)
    lines = [
        json.dumps({"id": "multi", "preset": "easy", "seed": 3, "turns": turns}),
        json.dumps(
            {"id": "path", "preset": "easy", "seed": 3, "answer": f"<answer>{letters}</answer>"}
        ),
        "{not json",
        json.dumps({"preset": "easy", "seed": -1, "turns": []}),
        json.dumps({"preset": "easy", "seed": 1, "spec": "bogus", "turns": []}),
        json.dumps({"preset": "easy", "seed": 1}),
        "",
        json.dumps(
            {"id": "sft", "preset": "easy", "seed": 3, "turns": turns, "spec": "visgym_sft"}
        ),
    ]
    src = tmp_path / "episodes.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "scores.jsonl"
    proc = _run("score", str(src), "--spec", "efficiency", "-o", str(out))
    assert proc.returncode == 1
    assert "4 lines could not be scored" in proc.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["multi", "path", 3, 4, 5, 6, "sft"]
    assert rows[0]["reward"] == 1.0
    assert rows[0]["spec"] == "efficiency"
    assert rows[1]["solved"] is True
    assert "episodes.jsonl:3: not JSON" in rows[2]["error"]
    assert "'seed'" in rows[3]["error"]
    assert "unknown reward spec" in rows[4]["error"]
    assert "needs 'turns'" in rows[5]["error"]
    assert rows[6]["reward"] == 0.8  # solved, no format tags


def test_stdin_specs_and_usage_errors(tmp_path: Path) -> None:
    proc = _run("score", stdin=json.dumps({"preset": "hard", "seed": 1, "turns": ["stop"]}) + "\n")
    assert proc.returncode == 0, proc.stderr
    (row,) = [json.loads(x) for x in proc.stdout.splitlines()]
    assert row["terminated"] is True
    assert row["solved"] is False
    specs = [json.loads(x)["name"] for x in _run("specs").stdout.splitlines()]
    assert {"task", "visgym_sft", "efficiency"} <= set(specs)
    assert _run("score", "--spec", "nope", stdin="").returncode == 2
    missing = _run("score", str(tmp_path / "missing.jsonl"))
    assert missing.returncode == 2
    assert "cannot open" in missing.stderr
