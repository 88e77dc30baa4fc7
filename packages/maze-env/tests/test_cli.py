import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from maze_env import generate


def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "maze_env.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_show_json_contract() -> None:
    proc = run("show", "--preset", "easy", "--seed", "0", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    maze = generate("easy", 0)
    assert data == {
        "grid": maze.grid_rows(),
        "start": [7, 1],
        "goal": [1, 7],
        "optimal_moves": 12,
        "step_budget": 17,
    }
    assert all(set(row) <= {"#", "."} for row in data["grid"])


def test_render_writes_png(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "maze.png"
    proc = run("render", "--preset", "hard", "--seed", "3", "--token-aligned", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert np.asarray(Image.open(out)).shape == (11 * 32, 11 * 32, 3)


def test_play_with_words_solves() -> None:
    maze = generate("easy", 0)
    moves = "\n".join(d.word for d in maze.optimal_actions) + "\nstop\n"
    proc = run("play", "--seed", "0", stdin=moves)
    assert proc.returncode == 0, proc.stderr
    assert "solved!" in proc.stdout and "moves: 12, optimal: 12" in proc.stdout
    proc = run("play", "--seed", "0", stdin="up\n")
    assert proc.returncode == 1 and "input ended" in proc.stdout


def test_export_and_evalsets(tmp_path: Path) -> None:
    proc = run("export", "--out", str(tmp_path), "--train-size", "4", "--format", "jsonl")
    assert proc.returncode == 0, proc.stderr
    assert len((tmp_path / "train.jsonl").read_text().splitlines()) == 4
    proc = run("evalsets")
    assert proc.returncode == 0 and "easy-64" in proc.stdout and " ok" in proc.stdout


def test_bench_script_prints_a_table() -> None:
    script = Path(__file__).parents[1] / "benchmarks" / "bench_env.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--seconds", "0.05"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "easy reset+render (us)" in proc.stdout and "VisGym" in proc.stdout


def test_bad_input_exits_2_with_one_line() -> None:
    proc = run("show", "--preset", "10x10")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("maze-env: error:") and "odd" in proc.stderr
    proc = run("show", "--preset", "easy", "--seed", "-3")
    assert proc.returncode == 2 and "seed" in proc.stderr


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    proc = run("demo", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "oracle policy: solved 64/64 (100.00%)" in proc.stdout
    assert (tmp_path / "maze_0.png").exists() and (tmp_path / "datasets" / "train.parquet").exists()
