import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from maze_evaluation import read_records, read_series
from maze_evaluation.testing import ScriptedServer
from maze_evaluator.cli import main
from weight_sync import AdapterStore
from weight_sync.synthetic import tiny, write_adapter

SET = ["--eval-set", "small-64", "--limit", "4", "--no-progress"]


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as srv:
        yield srv


def _script() -> str:
    exe = Path(sys.executable).parent / "maze-eval"
    return str(exe) if exe.exists() else shutil.which("maze-eval") or "maze-eval"


def test_unknown_eval_set_exits_2_with_one_line() -> None:
    proc = subprocess.run(
        [_script(), "--endpoint", "http://127.0.0.1:9", "--model", "x", "--eval-set", "nope-64"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown eval set 'nope-64'" in lines[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["--endpoint", "http://127.0.0.1:9"],
        ["--model", "x"],
        ["--endpoint", "http://127.0.0.1:9", "--model", "x", "--samples", "0"],
    ],
)
def test_bad_backend_options_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("maze-eval: error:")


def test_low_score_exits_0_and_high_score_too(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad, good = tmp_path / "bad.jsonl", tmp_path / "good.jsonl"
    assert main(["--endpoint", server.url, "--model", "bumper", "--out", str(bad), *SET]) == 0
    assert "solve rate 0.00% (0/4)" in capsys.readouterr().out
    summary = tmp_path / "s.json"
    argv = [
        "run",
        "--endpoint",
        server.url,
        "--model",
        "oracle",
        "--out",
        str(good),
        "--summary-json",
        str(summary),
        "--report",
        str(tmp_path / "r.png"),
        *SET,
    ]
    assert main(argv) == 0
    assert "solve rate 100.00% (4/4)" in capsys.readouterr().out
    assert json.loads(summary.read_text())["solved"] == 4
    with Image.open(tmp_path / "r.png") as im:
        assert im.format == "PNG"

    chart = tmp_path / "cmp.png"
    assert main(["--compare", str(good), str(bad), "--out", str(chart)]) == 0
    out = capsys.readouterr().out
    assert "per-maze differences: 4 (solved only in good.jsonl: 4, only in bad.jsonl: 0)" in out
    assert f"chart: {chart}" in out
    with Image.open(chart) as im:
        assert im.format == "PNG" and im.width > im.height  # three panels side by side
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["compare", str(good), str(empty)]) == 2
    assert capsys.readouterr().err.strip() == f"maze-eval: error: {empty}: no records"

    assert main(["summary", str(bad), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["failures"]["out_of_budget"] == 4

    gif = tmp_path / "e.gif"
    assert main(["gif", str(good), "--seed", "2", "--out", str(gif), "--cell-px", "8"]) == 0
    rec = next(r for r in read_records(good) if r.seed == 2)
    with Image.open(gif) as im:
        assert im.format == "GIF" and getattr(im, "n_frames", 1) == len(rec.path)
    assert main(["gif", str(good), "--seed", "99", "--out", str(gif)]) == 2
    assert main(["report", str(bad), "--out", str(tmp_path / "b.png")]) == 0

    # The same --out again needs --resume; with it nothing is replayed.
    assert main(["--endpoint", server.url, "--model", "oracle", "--out", str(good), *SET]) == 2
    before = server.requests
    assert (
        main(["--endpoint", server.url, "--model", "oracle", "--out", str(good), "--resume", *SET])
        == 0
    )
    assert server.requests == before and len(read_records(good)) == 4


def test_dead_endpoint_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ScriptedServer() as srv:
        url = srv.url
    argv = [
        "--endpoint",
        url,
        "--model",
        "oracle",
        "--retries",
        "1",
        "--out",
        str(tmp_path / "r.jsonl"),
        *SET,
    ]
    assert main(argv) == 1
    assert "failed after 2 attempts" in capsys.readouterr().err


def test_in_process_random_model_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from maze_policy.model import build_tiny_vlm

    model = build_tiny_vlm(tmp_path / "model", seed=0)
    out = tmp_path / "r.jsonl"
    argv = [
        "--model-dir",
        str(model),
        "--out",
        str(out),
        "--max-new-tokens",
        "2",
        "--eval-set",
        "small-64",
        "--limit",
        "1",
        "--no-progress",
    ]
    assert main(argv) == 0
    rec = read_records(out)[0]
    assert rec.backend == "local" and rec.turns == len(rec.replies) > 0
    assert "small-64: 1 mazes, 1 episodes" in capsys.readouterr().out


def test_the_context_comes_from_the_adapter_unless_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from peft import LoraConfig, get_peft_model

    from maze_policy.contexts import CONTEXT_FILE, write_context
    from maze_policy.model import build_tiny_vlm, load_vlm

    model_dir = build_tiny_vlm(tmp_path / "model", seed=0)
    model, _ = load_vlm(model_dir)
    lora: Any = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))  # pyright: ignore[reportArgumentType]
    adapter = tmp_path / "adapter"
    lora.save_pretrained(str(adapter))
    write_context(adapter, "route")

    def run(out: str, *flags: str) -> tuple[str, str]:
        argv = ["--model-dir", str(model_dir), "--adapter", str(adapter), "--out"]
        argv += [str(tmp_path / out), "--max-new-tokens", "2", "--eval-set", "small-64"]
        assert main([*argv, "--limit", "1", "--no-progress", *flags]) == 0
        return read_records(tmp_path / out)[0].extra.get("context", "full"), capsys.readouterr().err

    context, err = run("recorded.jsonl")
    assert context == "route" and f"context: route (recorded in {adapter})" in err
    context, err = run("explicit.jsonl", "--context", "full")
    assert context == "full" and "the adapter was trained in context 'route'" in err
    (adapter / CONTEXT_FILE).write_text('{"context": 3}')
    argv = ["--model-dir", str(model_dir), "--adapter", str(adapter), "--out", str(tmp_path / "x")]
    assert main(argv) == 1
    assert f"{adapter / CONTEXT_FILE}: not a context record" in capsys.readouterr().err


def test_follow_evaluates_each_published_version(server: ScriptedServer, tmp_path: Path) -> None:
    store = AdapterStore(tmp_path / "sync", durable=False)
    store.publish(write_adapter(tmp_path / "a1", tiny(), seed=1), step=10)

    def publish_second() -> None:
        # Publish v2 once v1's results exist, so the follower sees both in turn.
        series = tmp_path / "out" / "series.jsonl"
        for _ in range(600):
            if series.exists() and series.read_text().strip():
                break
            threading.Event().wait(0.05)
        store.publish(write_adapter(tmp_path / "a2", tiny(), seed=2), step=20)

    t = threading.Thread(target=publish_second)
    t.start()
    argv = [
        "follow",
        "--sync-dir",
        str(tmp_path / "sync"),
        "--out-dir",
        str(tmp_path / "out"),
        "--endpoint",
        server.url,
        "--model",
        "oracle",
        "--max-versions",
        "2",
        "--idle-timeout",
        "60",
        "--poll-interval",
        "0.1",
        *SET,
    ]
    assert main(argv) == 0
    t.join(timeout=30)
    series = read_series(tmp_path / "out")
    assert [(e["version"], e["step"], e["solve_rate"]) for e in series] == [
        (1, 10, 1.0),
        (2, 20, 1.0),
    ]
    assert read_records(tmp_path / "out" / "v000002.jsonl")[0].version == 2
    with Image.open(tmp_path / "out" / "series.png") as im:
        assert im.format == "PNG" and im.width > 400


def _first_image_width(server: ScriptedServer) -> int:
    import base64
    import io

    parts = [
        p
        for m in server.bodies[-1]["messages"]
        if isinstance(m["content"], list)
        for p in m["content"]
    ]
    uri = next(p["image_url"]["url"] for p in parts if p.get("type") == "image_url")
    with Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))) as img:
        return img.width


def test_the_rendering_comes_from_the_endpoint_unless_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one = ["--eval-set", "small-64", "--limit", "1", "--no-progress"]  # 7x7 mazes
    with ScriptedServer(renderings={"oracle": 25}) as srv:
        argv = ["--endpoint", srv.url, "--model", "oracle", *one]
        assert main([*argv, "--out", str(tmp_path / "a.jsonl")]) == 0
        err = capsys.readouterr().err
        assert f"rendering: 25 px per square (listed for oracle by {srv.url}/v1/models)" in err
        assert _first_image_width(srv) == 7 * 25
        assert main([*argv, "--out", str(tmp_path / "b.jsonl"), "--cell-px", "32"]) == 0
        assert "rendering: 32 px per square (--cell-px)" in capsys.readouterr().err
        assert _first_image_width(srv) == 7 * 32
    with ScriptedServer() as srv:  # lists no rendering: the default
        argv = ["--endpoint", srv.url, "--model", "oracle", *one]
        assert main([*argv, "--out", str(tmp_path / "c.jsonl")]) == 0
        assert "rendering: 32 px per square (default: nothing recorded)" in capsys.readouterr().err
