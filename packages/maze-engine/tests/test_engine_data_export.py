"""The local engine's dataset export: reused when unchanged, an error naming the key when the
``local:`` settings no longer match an existing run directory's data, and the user's own files
(no manifest) taken as they are."""

from pathlib import Path

import pytest

from maze_engine.config import LocalConfig, LocalConfigError
from maze_engine.data import read_rows
from maze_engine.skyrl_cluster import DATA_MANIFEST, load_config
from maze_engine.trainer import export_data


def _setup(run: Path, **local: object) -> tuple[object, LocalConfig]:
    cfg, local_dict = load_config("tiny_local", [f"trainer.export_path={run}"])
    return cfg, LocalConfig.from_dict({**local_dict, "train_size": 8, **local})


def test_export_then_reuse_then_refuse_changed_settings(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cfg, local = _setup(tmp_path)
    train, val = export_data(cfg, local, data)
    assert (data / DATA_MANIFEST).is_file()
    rows = read_rows(train)
    assert len(rows) == 8 and {r["preset"] for r in rows} == {"5x5"}
    assert len(read_rows(val)) == 64
    stamp = Path(train[0]).stat().st_mtime_ns

    assert export_data(cfg, local, data) == (train, val)  # unchanged settings: reused as is
    assert Path(train[0]).stat().st_mtime_ns == stamp

    cfg7, local7 = _setup(tmp_path, train_preset="7x7")
    with pytest.raises(LocalConfigError, match=r"local\.train_preset is '7x7' but the datasets"):
        export_data(cfg7, local7, data)
    assert Path(train[0]).stat().st_mtime_ns == stamp  # nothing overwritten

    # A manifest from another version (an extra key) is refused too, not taken for a match.
    manifest = data / DATA_MANIFEST
    manifest.write_text(manifest.read_text()[:-2] + ', "extra": 1}')
    with pytest.raises(LocalConfigError, match="the data settings differ"):
        export_data(cfg, local, data)

    # Files without our manifest are the user's own: used whatever the local settings say.
    (data / DATA_MANIFEST).unlink()
    assert export_data(cfg7, local7, data) == (train, val)
    assert {r["preset"] for r in read_rows(train)} == {"5x5"}
