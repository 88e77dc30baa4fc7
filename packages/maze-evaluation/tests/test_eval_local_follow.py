import json
import threading
from pathlib import Path

import pytest
from PIL import Image

from maze_env import generate
from maze_evaluation import BackendError, Summary, follow, read_series, summarize
from maze_evaluation.local import LocalBackend
from maze_verifier import score_episode
from weight_sync import AdapterStore, PublishedVersion

SET = "small-64"


def test_in_process_tiny_model_gives_valid_records(tiny_model: Path, tmp_path: Path) -> None:
    from maze_evaluation import evaluate

    backend = LocalBackend(tiny_model, batch_size=4)
    recs = evaluate(
        backend, eval_set=SET, limit=2, max_new_tokens=3, out=tmp_path / "r.jsonl", progress=False
    )
    assert [r.key for r in recs] == [(0, 0), (1, 0)]
    for r in recs:
        maze = generate(r.preset, r.seed)
        score = score_episode(maze, r.replies, step_budget=r.step_budget)
        assert r.turns == len(r.replies) == score.turns
        assert (r.solved, r.moves, r.bumps, r.parse_failures) == (
            score.solved,
            score.moves,
            score.bumps,
            score.invalid,
        )
        assert r.path[0] == list(maze.start) and r.backend == "local" and r.model == str(tiny_model)
    s = summarize(recs)
    assert s.episodes == 2 and 0.0 <= s.solve_rate <= 1.0


@pytest.mark.parametrize("context", ["recent", "route", "route-recent"])
def test_in_process_context_plays_the_trainers_rollout_in_that_context(
    tiny_model: Path, context: str
) -> None:
    from maze_evaluation import eval_rows, evaluate, sampling_params
    from maze_policy.rollout import run_episodes

    backend = LocalBackend(tiny_model, batch_size=2, context=context)
    recs = evaluate(backend, eval_set=SET, limit=2, max_new_tokens=6, progress=False)
    sampling = sampling_params(1, None, 6)
    rows = eval_rows(SET, limit=2)
    direct = run_episodes(backend.policy, rows, sampling=sampling, seed=0, context=context)
    assert [r.replies for r in recs] == [e.replies for e in direct]
    assert all(r.extra == {"context": context} for r in recs)
    with pytest.raises(ValueError, match="context must be one of full, latest, recent"):
        LocalBackend(tiny_model, context="window")


def test_bad_model_and_adapter_dirs_are_clear_errors(tiny_model: Path, tmp_path: Path) -> None:
    with pytest.raises(BackendError, match=r"no config\.json"):
        LocalBackend(tmp_path)
    with pytest.raises(BackendError, match="not a PEFT adapter directory"):
        LocalBackend(tiny_model, tmp_path)


def _publish_adapter(model_dir: Path, out: Path, seed: int, store: AdapterStore) -> int:
    import torch

    from maze_policy.lora import apply_lora, lora_config
    from maze_policy.model import load_vlm

    model, _ = load_vlm(model_dir)
    peft = apply_lora(model, lora_config(rank=2, alpha=4))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    peft.save_pretrained(out)  # pyright: ignore[reportCallIssue]
    return store.publish(out, step=seed).version


def test_continuous_mode_evaluates_two_published_versions(tiny_model: Path, tmp_path: Path) -> None:
    sync = tmp_path / "sync"
    store = AdapterStore(sync, durable=False)
    out_dir = tmp_path / "series"
    seen: list[int] = []
    v1 = _publish_adapter(tiny_model, tmp_path / "a1", 1, store)
    backend = LocalBackend(tiny_model, batch_size=2)

    def backend_for(pv: PublishedVersion) -> LocalBackend:
        backend.load_adapter(pv.path, pv.version)
        return backend

    def on_summary(version: int, s: Summary) -> None:
        seen.append(version)
        if version == v1:  # publish the next version while the follower waits
            threading.Thread(
                target=_publish_adapter, args=(tiny_model, tmp_path / "a2", 2, store)
            ).start()

    summaries = follow(
        sync,
        out_dir,
        backend_for,
        idle_timeout=60,
        max_versions=2,
        poll_interval=0.2,
        on_summary=on_summary,
        eval_set=SET,
        limit=1,
        max_new_tokens=2,
        progress=False,
    )
    assert seen == [1, 2] and len(summaries) == 2
    series = read_series(out_dir)
    assert [e["version"] for e in series] == [1, 2] and [e["step"] for e in series] == [1, 2]
    with Image.open(out_dir / "series.png") as im:  # redrawn after each version
        assert im.format == "PNG" and im.width > 400
    for v in (1, 2):
        rec = json.loads((out_dir / f"v{v:06d}.jsonl").read_text().splitlines()[0])
        assert rec["version"] == v and rec["adapter"] == str(store.get(v).path)
    # A restart skips the versions already in the series.
    again = follow(
        sync,
        out_dir,
        backend_for,
        idle_timeout=0.5,
        poll_interval=0.1,
        eval_set=SET,
        limit=1,
        max_new_tokens=2,
        progress=False,
    )
    assert again == [] and len(read_series(out_dir)) == 2
