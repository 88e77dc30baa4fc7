"""S3 mirror against a real moto server on loopback."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

pytest.importorskip("boto3")
pytest.importorskip("moto")

import boto3
from moto.server import ThreadedMotoServer

from weight_sync import (
    AdapterStore,
    BackgroundMirror,
    MirrorError,
    S3Mirror,
    VerificationError,
    parse_s3_uri,
)
from weight_sync.cli import main as cli_main
from weight_sync.synthetic import adapter_files, tiny


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Any:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    client = cast(Any, boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1"))
    bucket = "adapters-" + request.node.name.replace("_", "-").lower()[:40]
    client.create_bucket(Bucket=bucket)
    setattr(client, "test_bucket", bucket)  # noqa: B010  # tests find the bucket on the client
    return client


def test_upload_then_download_round_trip(s3: Any, store: AdapterStore, tmp_path: Path):
    mirror = S3Mirror(s3.test_bucket, "runs/exp1", s3)
    assert mirror.remote_latest() is None
    v1 = store.publish(adapter_files(tiny(), seed=1))
    v2 = store.publish(adapter_files(tiny(), seed=2))
    keys = mirror.upload(v1)
    assert keys[-1] == "runs/exp1/latest"
    assert "runs/exp1/versions/v000000001/manifest.json" in keys
    mirror.upload(v2)
    assert mirror.remote_latest() == 2
    mirror.upload(v1)  # re-uploading an old version never moves latest back
    assert mirror.remote_latest() == 2

    cache = tmp_path / "cache"
    got = mirror.download(cache)
    assert got.version == 2
    assert got.path == cache / "v000000002"
    for name in v2.manifest.files:
        assert (got.path / name).read_bytes() == (v2.path / name).read_bytes()
    assert mirror.download(cache, 1).manifest == v1.manifest
    # A second download reuses the verified cache entry.
    before = (got.path / "adapter_model.safetensors").stat().st_ino
    assert mirror.download(cache, 2).path == got.path
    assert (got.path / "adapter_model.safetensors").stat().st_ino == before


def test_corrupt_object_is_rejected_and_cache_untouched(
    s3: Any, store: AdapterStore, tmp_path: Path
):
    mirror = S3Mirror(s3.test_bucket, "", s3)
    pv = store.publish(adapter_files(tiny(), seed=1))
    mirror.upload(pv)
    key = "versions/v000000001/adapter_model.safetensors"
    s3.put_object(Bucket=s3.test_bucket, Key=key, Body=b"garbage")
    cache = tmp_path / "cache"
    with pytest.raises(VerificationError, match=r"adapter_model\.safetensors: downloaded 7 bytes"):
        mirror.download(cache)
    assert not (cache / "v000000001").exists()
    assert list((cache / ".staging").iterdir()) == []


def test_damaged_cache_entry_is_replaced(s3: Any, store: AdapterStore, tmp_path: Path):
    mirror = S3Mirror(s3.test_bucket, "p", s3)
    mirror.upload(store.publish(adapter_files(tiny(), seed=1)))
    cache = tmp_path / "cache"
    got = mirror.download(cache)
    (got.path / "adapter_config.json").write_text("{}")
    again = mirror.download(cache)
    assert (again.path / "adapter_config.json").read_bytes() == adapter_files(tiny(), seed=1)[
        "adapter_config.json"
    ]


def test_lying_remote_manifest_is_detected(s3: Any, store: AdapterStore, tmp_path: Path):
    mirror = S3Mirror(s3.test_bucket, "", s3)
    mirror.upload(store.publish(adapter_files(tiny(), seed=1)))
    mkey = "versions/v000000001/manifest.json"
    body = s3.get_object(Bucket=s3.test_bucket, Key=mkey)["Body"].read()
    s3.put_object(Bucket=s3.test_bucket, Key=mkey, Body=body.replace(b'"step": 1', b'"step": 2'))
    with pytest.raises(VerificationError, match="sha256 does not match remote latest"):
        mirror.download(tmp_path / "cache")


def test_missing_objects_give_clear_errors(s3: Any, tmp_path: Path):
    mirror = S3Mirror(s3.test_bucket, "nothing-here", s3)
    with pytest.raises(MirrorError, match="nothing published"):
        mirror.download(tmp_path / "c")
    with pytest.raises(MirrorError, match=r"v000000007/manifest\.json: no such object"):
        mirror.download(tmp_path / "c", 7)
    bad = S3Mirror("no-such-bucket-xyz", "", s3)
    with pytest.raises(MirrorError, match="no-such-bucket-xyz"):
        bad.remote_latest()


def test_cli_push_and_pull(
    s3: Any,
    s3_endpoint: str,
    store: AdapterStore,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
):
    store.publish(adapter_files(tiny(), seed=4))
    common = ["--bucket", s3.test_bucket, "--prefix", "cli", "--endpoint-url", s3_endpoint]
    assert cli_main(["s3-push", "--root", str(store.root), *common]) == 0
    assert "uploaded version 1 (4 objects" in capsys.readouterr().out
    cache = tmp_path / "cache"
    assert cli_main(["s3-pull", "--cache", str(cache), *common]) == 0
    assert "downloaded version 1 (step 1" in capsys.readouterr().out
    assert (cache / "v000000001" / "manifest.json").exists()
    assert cli_main(["s3-pull", "--cache", str(cache), *common, "9"]) == 1
    assert "no such object" in capsys.readouterr().err


def _tree(root: Path) -> Path:
    (root / "policy").mkdir(parents=True)
    (root / "policy" / "model_world_size_1_rank_0.pt").write_bytes(b"w" * 1000)
    (root / "trainer_state.json").write_text("{}")
    (root / "manifest.json").write_text('{"files": {}}')
    return root


def test_background_mirror_uploads_trees_manifest_last(s3: Any, tmp_path: Path):
    order: list[str] = []

    class Recording:
        def upload_file(self, filename: str, bucket: str, key: str) -> None:
            order.append(key)
            s3.upload_file(filename, bucket, key)

    mirror = BackgroundMirror(f"s3://{s3.test_bucket}/runs/r1/ckpt", client_factory=Recording)
    mirror.submit(_tree(tmp_path / "global_step_2"))
    mirror.submit(_tree(tmp_path / "global_step_4"))
    stats = mirror.close(timeout=30)
    assert (stats.uploaded, stats.failures, stats.pending) == (2, 0, 0)
    assert order[:3] == [
        "runs/r1/ckpt/global_step_2/policy/model_world_size_1_rank_0.pt",
        "runs/r1/ckpt/global_step_2/trainer_state.json",
        "runs/r1/ckpt/global_step_2/manifest.json",
    ]
    body = s3.get_object(Bucket=s3.test_bucket, Key=order[0])["Body"].read()
    assert body == b"w" * 1000
    with pytest.raises(MirrorError, match="closed"):
        mirror.submit(tmp_path)


def test_background_mirror_retries_a_missing_bucket_without_raising(s3: Any, tmp_path: Path):
    logged: list[str] = []
    bucket = s3.test_bucket + "-late"
    mirror = BackgroundMirror(
        f"s3://{bucket}/ckpt",
        client_factory=lambda: s3,
        retry_initial_s=0.05,
        retry_max_s=0.2,
        log=logged.append,
    )
    mirror.submit(_tree(tmp_path / "global_step_1"))
    for _ in range(200):  # the bucket does not exist yet: attempts fail and are counted
        if mirror.stats().failures >= 2:
            break
        time.sleep(0.05)
    stats = mirror.stats()
    assert stats.failures >= 2 and stats.uploaded == 0 and stats.pending == 1
    assert "NoSuchBucket" in stats.last_error
    assert "global_step_1" in logged[0] and "retrying" in logged[0]
    s3.create_bucket(Bucket=bucket)  # the operator fixes the bucket: the next retry lands
    stats = mirror.close(timeout=30)
    assert (stats.uploaded, stats.pending) == (1, 0)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert "ckpt/global_step_1/manifest.json" in keys


def test_background_mirror_to_an_unreachable_endpoint_gives_up_only_at_close(tmp_path: Path):
    from botocore.config import Config

    port = _free_port()  # nothing listens there

    def client() -> Any:
        return cast(Any, boto3.client)(
            "s3",
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-east-1",
            aws_access_key_id="x",
            aws_secret_access_key="x",
            config=Config(connect_timeout=0.5, retries={"max_attempts": 1}),
        )

    logged: list[str] = []
    mirror = BackgroundMirror(
        "s3://b/p", client_factory=client, retry_initial_s=0.05, log=logged.append
    )
    mirror.submit(_tree(tmp_path / "global_step_3"))
    stats = mirror.close(timeout=1.0)
    assert stats.failures >= 1 and stats.uploaded == 0 and stats.pending == 1
    assert "Could not connect" in stats.last_error
    assert logged[-1].endswith("not mirrored to s3://b/p before closing: global_step_3")


def test_s3_uris_are_checked() -> None:
    assert parse_s3_uri("s3://bucket/a/b/") == ("bucket", "a/b")
    assert parse_s3_uri("s3://bucket") == ("bucket", "")
    for bad in ("bucket/a", "s3:///a", "https://bucket/a"):
        with pytest.raises(MirrorError):
            parse_s3_uri(bad)
