"""Datasets for the cluster: exported by maze-env, read by SkyRL's loader, played by the env."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from maze_engine.skyrl_cluster import (
    DATA_MANIFEST,
    TINY_LOCAL_CONFIG,
    SkyRLConfigError,
    eval_slack,
    load_config,
    prepare_datasets,
    register_maze_env,
)
from maze_env import Direction, generate, get_eval_set
from maze_env.actions import Action

# HF datasets forks a helper while torch's threads exist; harmless here, noisy in the log.
pytestmark = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded:DeprecationWarning"
)

TRAIN_SIZE = 8
EASY_64_TURNS = ["generator.max_turns=21"]  # 16 moves + stop + 4: finishes every easy-64 maze
SFT_REPLY = "<observation>blue at {pos}</observation><justification>path</justification>{action}"

# A chat template shaped like Qwen-VL's: content may be a list of text / image parts.
_TEMPLATE = (
    "{%- for m in messages -%}<|im_start|> {{ m['role'] }}"
    "{%- if m['content'] is string %} {{ m['content'] }}"
    "{%- else %}{% for p in m['content'] %}"
    "{%- if p['type'] == 'text' %} {{ p['text'] }}{% else %} <|image_pad|>{% endif %}"
    "{%- endfor %}{% endif %} <|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|> assistant{% endif %}"
)


def _tokenizer() -> Any:
    """A word-level tokenizer built in-process (no download) with a Qwen-style chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<|im_start|>", "<|im_end|>", "<|image_pad|>"]
    words = "you are navigating a maze here is the what your first action system user assistant"
    vocab = {w: i for i, w in enumerate([*specials, *dict.fromkeys(words.split())])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        additional_special_tokens=specials[1:],
        chat_template=_TEMPLATE,
    )


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    # These tests export easy-64 (the cluster's eval set): give it a budget that finishes it.
    cfg, _ = load_config(TINY_LOCAL_CONFIG, EASY_64_TURNS)
    out = tmp_path_factory.mktemp("shared") / "runs" / "t" / "data"
    return cfg, prepare_datasets(cfg, out, train_size=TRAIN_SIZE)


def _skyrl_rows(path: Path, max_prompt_length: int) -> Any:
    from skyrl.train.dataset import PromptDataset

    return PromptDataset(
        datasets=[str(path)],
        tokenizer=_tokenizer(),
        max_prompt_length=max_prompt_length,
        num_workers=1,
    )


def test_prepare_datasets_points_skyrl_config_at_the_files(exported: tuple[Any, Any]) -> None:
    cfg, ds = exported
    assert ds.train.is_file() and ds.validation.is_file() and ds.manifest.name == DATA_MANIFEST
    assert cfg.data.train_data == [str(ds.train)]
    assert cfg.data.val_data == [str(ds.validation)]
    assert ds.slack == eval_slack(cfg.generator.max_turns, "easy-64")
    assert ds.max_step_budget == cfg.generator.max_turns
    assert not ds.reused


def test_skyrl_prompt_dataset_reads_the_validation_split(exported: tuple[Any, Any]) -> None:
    cfg, ds = exported
    rows = _skyrl_rows(ds.validation, cfg.trainer.max_prompt_length)
    es = get_eval_set("easy-64")
    assert len(rows) == len(es.seeds)
    budgets: list[int] = []
    for i in range(len(rows)):
        messages, env_class, extras, _uid = rows[i]
        assert env_class == "maze"
        assert [m["role"] for m in messages] == ["system", "user"]
        assert any(p["type"] == "image_url" for p in messages[1]["content"])
        assert extras["seed"] == es.seeds[i] and extras["preset"] == "easy"
        assert extras["reward_spec"]["spec"] == "task"
        maze = generate("easy", extras["seed"])
        assert extras["step_budget"] == maze.optimal_moves + 1 + ds.slack
        budgets.append(extras["step_budget"])
    # The longest eval maze takes exactly max_turns turns: solvable, with no spare.
    assert max(budgets) == cfg.generator.max_turns


def test_skyrl_prompt_dataset_reads_the_train_split(exported: tuple[Any, Any]) -> None:
    cfg, ds = exported
    rows = _skyrl_rows(ds.train, cfg.trainer.max_prompt_length)
    assert len(rows) == TRAIN_SIZE
    eval_seeds = set(get_eval_set("easy-64").seeds)
    for i in range(len(rows)):
        _messages, env_class, extras, _uid = rows[i]
        assert env_class == "maze"
        assert extras["reward_spec"]["spec"] == "visgym_sft"
        assert extras["seed"] not in eval_seeds
    # SkyRL's loader really filters by length with the tokenizer: a 5-token limit drops all.
    assert len(_skyrl_rows(ds.train, 5)) == 0


def test_prepare_datasets_reuses_matching_files_and_rebuilds_changed_ones(
    exported: tuple[Any, Any],
) -> None:
    cfg, ds = exported
    before = ds.train.stat().st_mtime_ns
    again = prepare_datasets(cfg, ds.train.parent, train_size=TRAIN_SIZE)
    assert again.reused and ds.train.stat().st_mtime_ns == before
    other = prepare_datasets(cfg, ds.train.parent, train_size=TRAIN_SIZE, train_reward_spec="task")
    assert not other.reused
    rows = _skyrl_rows(other.train, cfg.trainer.max_prompt_length)
    assert rows[0][2]["reward_spec"]["spec"] == "task"
    prepare_datasets(cfg, ds.train.parent, train_size=TRAIN_SIZE)  # back, for the other tests


def test_prepare_datasets_rejects_unusable_settings(tmp_path: Path) -> None:
    cfg, _ = load_config(TINY_LOCAL_CONFIG, ["generator.max_turns=12"])
    with pytest.raises(SkyRLConfigError) as e:
        prepare_datasets(cfg, tmp_path)
    assert e.value.key == "generator.max_turns"
    cfg, _ = load_config(TINY_LOCAL_CONFIG, EASY_64_TURNS)
    with pytest.raises(SkyRLConfigError) as e:
        prepare_datasets(cfg, tmp_path, train_size=2)
    assert e.value.key == "trainer.train_batch_size"
    with pytest.raises(SkyRLConfigError) as e:
        prepare_datasets(cfg, tmp_path, train_reward_spec="shiny")
    assert e.value.key == "train_reward_spec"
    assert not list(tmp_path.iterdir())  # nothing written on a bad request


def _play(extras: dict[str, Any], prompt: list[dict[str, Any]], replies: list[str]) -> Any:
    """Drive the env through skyrl-gym exactly as SkyRL's generator does."""
    import skyrl_gym

    extras = {**extras, "max_turns": 21}  # SkyRL writes generator.max_turns here
    env: Any = skyrl_gym.make("maze", env_config={}, extras=extras)  # pyright: ignore[reportUnknownVariableType] - skyrl_gym is untyped
    conversation, _meta = env.init(prompt)
    assert conversation
    out: Any = None
    for i, reply in enumerate(replies):
        out = env.step(reply)
        assert out["done"] == (i == len(replies) - 1)
    env.close()
    return out


def _optimal_replies(seed: int) -> list[str]:
    maze = generate("easy", seed)
    actions = [Action.move(Direction(d)) for d in maze.optimal_actions] + [Action.stop()]
    return [SFT_REPLY.format(pos=i, action=a.to_tag()) for i, a in enumerate(actions)]


def test_env_registers_and_solves_a_validation_maze_with_reward_1(
    exported: tuple[Any, Any],
) -> None:
    cfg, ds = exported
    assert register_maze_env() == "maze"
    assert register_maze_env() == "maze"  # idempotent, as each Ray task registers again
    rows = _skyrl_rows(ds.validation, cfg.trainer.max_prompt_length)
    # The longest eval maze (16 moves): solvable within its budget of max_turns.
    idx = max(range(len(rows)), key=lambda i: rows[i][2]["step_budget"])
    prompt, _cls, extras, _uid = rows[idx]
    replies = _optimal_replies(extras["seed"])
    assert len(replies) == 17
    out = _play(extras, prompt, replies)
    assert out["reward"] == 1.0
    # The validation split scores the task alone: a tidy but wrong stop earns 0, so pass@1 is
    # the solve rate.
    wrong = _play(extras, prompt, [SFT_REPLY.format(pos=0, action="<action>stop</action>")])
    assert wrong["reward"] == 0.0


def test_train_rows_use_the_sft_reward(exported: tuple[Any, Any]) -> None:
    cfg, ds = exported
    register_maze_env()
    prompt, _cls, extras, _uid = _skyrl_rows(ds.train, cfg.trainer.max_prompt_length)[0]
    assert _play(extras, prompt, _optimal_replies(extras["seed"]))["reward"] == pytest.approx(1.0)
    # 0.8 x task + 0.2 x fraction of tagged turns: format alone earns 0.2.
    wrong = _play(extras, prompt, [SFT_REPLY.format(pos=0, action="<action>stop</action>")])
    assert wrong["reward"] == pytest.approx(0.2)
