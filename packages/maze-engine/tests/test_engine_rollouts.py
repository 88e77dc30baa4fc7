"""The local engine's rollouts honour ``generator.max_turns`` as SkyRL's generator does."""

import json
from pathlib import Path
from typing import Any

from maze_engine.config import LocalConfig
from maze_engine.trainer import Rollouts
from maze_engine.workers import lora_config_from_skyrl
from maze_env import MazeSpec
from maze_env.export import build_rows
from maze_policy.sampling import SamplingParams


def _rows(seeds: list[int], slack: int) -> list[dict[str, Any]]:
    rows = build_rows(MazeSpec.parse("5x5"), seeds, split="validation", slack=slack)
    return json.loads(json.dumps(rows))  # plain JSON types, as read back from parquet


def test_max_turns_caps_episodes_below_the_maze_budget(tiny_vlm_dir: Path, tmp_path: Path) -> None:
    from skyrl.train.config import SkyRLLoraConfig

    lora = SkyRLLoraConfig(
        rank=4, alpha=8, dropout=0.0, target_modules="all-linear", exclude_modules=".*visual.*"
    )
    rollouts = Rollouts(
        tiny_vlm_dir, lora_config_from_skyrl(lora), LocalConfig(rollout_workers=0), tmp_path
    )
    rows = _rows([0, 1, 2], slack=2)  # 4 moves + stop + 2: a budget of 7 turns each
    assert {r["step_budget"] for r in rows} == {7}
    sampling = SamplingParams(greedy=True, max_new_tokens=8)
    # The untrained model never stops, so its episodes run to whatever ends them first.
    uncapped = rollouts.run(rows, [0, 1, 2], [0, 1, 2], sampling, seed=0)
    capped = rollouts.run(rows, [0, 1, 2], [0, 1, 2], sampling, seed=0, max_turns=5)
    assert [e.turns for e in uncapped] == [7, 7, 7]
    assert [e.turns for e in capped] == [5, 5, 5]
    assert not any(e.solved for e in capped)
    # The capped episode is the uncapped one's first five turns.
    assert capped[0].replies == uncapped[0].replies[:5]
