"""Checkpoints and the final adapter reach S3 beside training (a real moto server on loopback);
a missing bucket is logged, retried and counted, and the run still finishes."""

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    # The mirror builds its own client from the environment, as on a cluster.
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _train(run: Path, base: Path, uri: str, *extra: str) -> tuple[Any, list[str]]:
    from maze_engine.config import load_config
    from maze_engine.trainer import train

    said: list[str] = []
    config = load_config(
        "smoke_5x5",
        [
            f"trainer.export_path={run}",
            f"trainer.policy.model.path={base}",
            "trainer.max_training_steps=2",
            "trainer.train_batch_size=2",
            "trainer.policy_mini_batch_size=2",
            "generator.n_samples_per_prompt=2",
            "generator.sampling_params.max_generate_length=8",
            "trainer.ckpt_interval=1",
            "trainer.eval_interval=0",
            "trainer.eval_before_train=false",
            "local.rollout_workers=0",
            "mazes.train_size=8",
            "local.progress=false",
            "local.tensorboard=false",
            f"local.ckpt_s3_uri={uri}",
            *extra,
        ],
    )
    return train(config, say=said.append), said


def _last_metrics(run: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return rows[-1]


def test_checkpoints_and_final_adapter_are_mirrored(s3: Any, base_model: Path, tmp_path: Path):
    s3.create_bucket(Bucket="runs")
    result, said = _train(tmp_path / "run", base_model, "s3://runs/exp1")
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="runs")["Contents"]}
    ckpt_root = Path(result.run_dir) / "ckpt"
    for step in ("global_step_1", "global_step_2"):
        local = {
            f"exp1/{step}/{p.relative_to(ckpt_root / step).as_posix()}"
            for p in (ckpt_root / step).rglob("*")
            if p.is_file()
        }
        assert local and local <= keys, (step, sorted(local - keys))
    # The adapter says how its training mazes were rendered (smoke_5x5: 32 px squares).
    assert json.loads((result.final_adapter / "maze_rendering.json").read_text()) == {"cell_px": 32}
    weights = result.final_adapter / "adapter_model.safetensors"
    remote = s3.get_object(Bucket="runs", Key="exp1/final_adapter/adapter_model.safetensors")
    assert remote["Body"].read() == weights.read_bytes()
    last = _last_metrics(Path(result.run_dir))
    assert (last["mirror/s3_uploaded"], last["mirror/s3_failures"], last["mirror/s3_pending"]) == (
        3.0,
        0.0,
        0.0,
    )
    assert said[-1] == "s3 mirror s3://runs/exp1: 3 uploaded, 0 failed attempts, 0 not mirrored"


def test_a_missing_bucket_never_stops_training(s3: Any, base_model: Path, tmp_path: Path):
    del s3  # the endpoint is up; the bucket "nowhere" does not exist
    result, said = _train(
        tmp_path / "run", base_model, "s3://nowhere/exp", "local.ckpt_s3_drain_s=1"
    )
    assert result.global_step == 2
    assert (result.final_adapter / "adapter_model.safetensors").is_file()
    last = _last_metrics(Path(result.run_dir))
    assert last["mirror/s3_uploaded"] == 0.0
    assert last["mirror/s3_failures"] >= 1.0 and last["mirror/s3_pending"] >= 1.0
    assert any("NoSuchBucket" in m and "retrying" in m for m in said)
    assert any(m.startswith("s3 mirror: not mirrored to s3://nowhere/exp") for m in said)
