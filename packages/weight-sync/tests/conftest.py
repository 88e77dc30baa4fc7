from __future__ import annotations

from pathlib import Path

import pytest

from weight_sync import AdapterStore
from weight_sync.synthetic import tiny, write_adapter


@pytest.fixture
def adapter_dir(tmp_path: Path) -> Path:
    return write_adapter(tmp_path / "adapter", tiny(), seed=1)


@pytest.fixture
def store(tmp_path: Path) -> AdapterStore:
    return AdapterStore(tmp_path / "root")
