"""Fixtures: one tiny Qwen3-VL and two LoRA adapters per session; real uvicorn servers."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from maze_policy.model import build_tiny_vlm, load_vlm
from maze_serving.app import create_app
from maze_serving.engine import EngineConfig, ServingEngine
from maze_serving.server import serve_in_thread

BASE = "tiny"
TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    # Two CI cores shared with the test process's own HTTP client: one intra-op thread.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny_vlm") / BASE, seed=0)


def make_adapter(model_dir: Path, out: Path, seed: int) -> Path:
    """A rank-4 LoRA with random (nonzero) A and B, so it really changes the outputs."""
    from peft import LoraConfig, get_peft_model

    model, _ = load_vlm(model_dir)
    torch.manual_seed(seed)
    cfg = LoraConfig(r=4, lora_alpha=64, target_modules=TARGETS, init_lora_weights=False)
    peft_model: Any = get_peft_model(model, cfg)  # pyright: ignore[reportArgumentType]
    peft_model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def adapters(tiny_vlm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("adapters")
    return [make_adapter(tiny_vlm_dir, root / f"a{i}", seed=i) for i in (1, 2)]


def wait_ready(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(f"{url}/health", timeout=5).status_code == 200:
            return
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout} s")


ServerFactory = Callable[..., AbstractContextManager[str]]


@pytest.fixture
def start_server(tiny_vlm_dir: Path) -> ServerFactory:
    """``with start_server(**EngineConfig fields) as url:`` a ready server on 127.0.0.1."""

    @contextmanager
    def factory(
        *,
        max_body_bytes: int = 1 << 20,
        wait: bool = True,
        engine_kwargs: dict[str, Any] | None = None,
        **kw: Any,
    ) -> Generator[str]:
        kw.setdefault("served_model_name", BASE)
        config = EngineConfig(model_path=str(tiny_vlm_dir), **kw)
        engine = ServingEngine(config, **(engine_kwargs or {}))
        app = create_app(config, max_body_bytes=max_body_bytes, engine=engine)
        with serve_in_thread(app) as url:
            if wait:
                wait_ready(url)
            yield url

    return factory


@pytest.fixture
def server(start_server: ServerFactory) -> Iterator[str]:
    with start_server() as url:
        yield url


@pytest.fixture(scope="session")
def maze_messages() -> list[dict[str, Any]]:
    """The real first turn of a maze episode: system prompt + token-aligned maze image + task."""
    from maze_env.maze import generate
    from maze_env.prompts import initial_messages
    from maze_env.render import token_aligned_style

    maze = generate("easy", seed=3)
    return [dict(m) for m in initial_messages(maze, 12, style=token_aligned_style())]
