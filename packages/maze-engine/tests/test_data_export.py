"""The one dataset exporter of both engines: rows maze-env builds, SkyRL's loader reads and the
maze env plays; reused while its manifest matches the ``mazes:`` settings, an error naming the key
when they changed for an existing run directory, and the user's own files taken as they are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from maze_engine.config import SMOKE_CONFIG, MazerlConfig, load_config
from maze_engine.data import DATA_MANIFEST, MazeDatasets, eval_slack, export_datasets, read_rows
from maze_engine.errors import ConfigError
from maze_env import Direction, generate, get_eval_set
from maze_env import __version__ as maze_env_version
from maze_env.actions import Action
from maze_verifier import register_env

# HF datasets forks a helper while torch's threads exist; harmless here, noisy in the log.
pytestmark = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded:DeprecationWarning"
)

TRAIN_SIZE = 8
# The cluster's datasets (easy mazes, easy-64, VisGym's SFT reward), with a budget that finishes
# easy-64: 16 moves + stop + 4.
CLUSTER_MAZES = [
    "generator.max_turns=21",
    "mazes.train_preset=easy",
    "mazes.eval_set=easy-64",
    "mazes.reward_spec=visgym_sft",
    "mazes.allow_eval_overlap=false",
    f"mazes.train_size={TRAIN_SIZE}",
]
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


def _config(run: Path, *overrides: str) -> MazerlConfig:
    return load_config(SMOKE_CONFIG, [f"trainer.export_path={run}", *overrides])


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
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[MazerlConfig, MazeDatasets]:
    config = _config(tmp_path_factory.mktemp("shared") / "runs" / "t", *CLUSTER_MAZES)
    return config, export_datasets(config)


def _skyrl_rows(path: Path, max_prompt_length: int) -> Any:
    from skyrl.train.dataset import PromptDataset

    return PromptDataset(
        datasets=[str(path)],
        tokenizer=_tokenizer(),
        max_prompt_length=max_prompt_length,
        num_workers=1,
    )


def test_export_writes_the_files_the_config_names_with_a_manifest(
    exported: tuple[MazerlConfig, MazeDatasets],
) -> None:
    config, ds = exported
    cfg = config.skyrl
    assert ds.train.is_file() and ds.validation.is_file()
    assert ds.manifest is not None and ds.manifest.name == DATA_MANIFEST
    assert ds.manifest.parent == config.data_dir
    assert [str(ds.train)] == cfg.data.train_data
    assert [str(ds.validation)] == cfg.data.val_data
    assert ds.slack == eval_slack(cfg.generator.max_turns, "easy-64") == 4
    assert not ds.reused
    # Everything that decides the files' bytes, so a resumed run (or the other engine) can tell.
    assert json.loads(ds.manifest.read_text()) == {
        "format": 3,
        "maze_env": maze_env_version,
        "train_preset": "easy",
        "train_size": TRAIN_SIZE,
        "eval_set": "easy-64",
        "cell_px": 32,
        "reward_spec": "visgym_sft",
        "allow_eval_overlap": False,
        "slack": 4,
        "eval_reward_spec": "task",
    }


def test_skyrl_prompt_dataset_reads_the_validation_split(
    exported: tuple[MazerlConfig, MazeDatasets],
) -> None:
    config, ds = exported
    cfg = config.skyrl
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


def test_skyrl_prompt_dataset_reads_the_train_split(
    exported: tuple[MazerlConfig, MazeDatasets],
) -> None:
    config, ds = exported
    cfg = config.skyrl
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


def test_export_reuses_matching_files_and_refuses_changed_ones(
    exported: tuple[MazerlConfig, MazeDatasets],
) -> None:
    config, ds = exported
    before = ds.train.stat().st_mtime_ns
    again = export_datasets(config)
    assert again.reused and again == MazeDatasets(
        ds.train, ds.validation, ds.manifest, ds.slack, reused=True
    )
    assert ds.train.stat().st_mtime_ns == before
    # Another reward spec for the same run directory: refused, naming the key, files untouched.
    run = config.skyrl.trainer.export_path
    task = _config(Path(run), *CLUSTER_MAZES, "mazes.reward_spec=task")
    with pytest.raises(ConfigError, match=r"mazes\.reward_spec gives reward_spec='task' but") as e:
        export_datasets(task)
    assert "'visgym_sft'" in str(e.value) and str(config.data_dir) in str(e.value)
    assert ds.train.stat().st_mtime_ns == before
    # A changed max_turns changes every budget: the error names the key that sets the slack.
    longer = _config(Path(run), *CLUSTER_MAZES, "generator.max_turns=22")
    with pytest.raises(ConfigError, match=r"generator\.max_turns gives slack=5 but"):
        export_datasets(longer)
    # overwrite=True rebuilds them with the new settings.
    other = export_datasets(task, overwrite=True)
    assert not other.reused
    rows = _skyrl_rows(other.train, config.skyrl.trainer.max_prompt_length)
    assert rows[0][2]["reward_spec"]["spec"] == "task"
    export_datasets(config, overwrite=True)  # back, for the other tests


def test_export_rejects_unusable_settings_before_writing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        _config(tmp_path, *CLUSTER_MAZES, "generator.max_turns=12")
    assert e.value.key == "generator.max_turns"
    with pytest.raises(ConfigError) as e:
        _config(tmp_path, *CLUSTER_MAZES, "mazes.reward_spec=shiny")
    assert e.value.key == "mazes.reward_spec"
    # Fewer training mazes than one step's prompts.
    with pytest.raises(ConfigError) as e:
        export_datasets(_config(tmp_path, *CLUSTER_MAZES, "mazes.train_size=2"))
    assert e.value.key == "trainer.train_batch_size"
    # 5x5 has 16 layouts, all in tiny-64: training cannot avoid the eval mazes unless allowed.
    with pytest.raises(ConfigError, match="allow_eval_overlap=true") as e:
        export_datasets(_config(tmp_path, "mazes.allow_eval_overlap=false"))
    assert e.value.key == "mazes.train_preset"
    assert not list(tmp_path.iterdir())  # nothing written on a bad request


def test_local_engine_datasets_reused_refused_or_the_users_own(tmp_path: Path) -> None:
    config = _config(tmp_path, f"mazes.train_size={TRAIN_SIZE}")  # smoke_5x5: 5x5, tiny-64
    ds = export_datasets(config)
    manifest = tmp_path / "data" / DATA_MANIFEST
    assert ds.manifest == manifest and manifest.is_file()
    rows = read_rows([ds.train])
    assert len(rows) == TRAIN_SIZE and {r["preset"] for r in rows} == {"5x5"}
    assert {r["reward_spec"]["spec"] for r in rows} == {"task"}
    assert len(read_rows([ds.validation])) == 64
    stamp = ds.train.stat().st_mtime_ns

    assert export_datasets(config).reused  # unchanged settings: reused as is
    assert ds.train.stat().st_mtime_ns == stamp

    seven = _config(tmp_path, f"mazes.train_size={TRAIN_SIZE}", "mazes.train_preset=7x7")
    with pytest.raises(
        ConfigError, match=r"mazes\.train_preset gives train_preset='7x7' but the datasets"
    ):
        export_datasets(seven)
    assert ds.train.stat().st_mtime_ns == stamp  # nothing overwritten

    # A manifest from another version (an extra key) is refused too, not taken for a match.
    manifest.write_text(manifest.read_text().rstrip()[:-1] + ', "extra": 1}')
    with pytest.raises(ConfigError, match="the data settings differ"):
        export_datasets(config)

    # Files without our manifest are the user's own: used whatever the mazes settings say.
    manifest.unlink()
    own = export_datasets(seven)
    assert own == MazeDatasets(ds.train, ds.validation, None, ds.slack, reused=True)
    assert {r["preset"] for r in read_rows([ds.train])} == {"5x5"}


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
    exported: tuple[MazerlConfig, MazeDatasets],
) -> None:
    config, ds = exported
    cfg = config.skyrl
    assert register_env(cfg.environment.env_class) == "maze"
    assert register_env(cfg.environment.env_class) == "maze"  # idempotent: each Ray task does it
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


def test_train_rows_use_the_sft_reward(exported: tuple[MazerlConfig, MazeDatasets]) -> None:
    config, ds = exported
    register_env(config.skyrl.environment.env_class)
    prompt, _cls, extras, _uid = _skyrl_rows(ds.train, config.skyrl.trainer.max_prompt_length)[0]
    assert _play(extras, prompt, _optimal_replies(extras["seed"]))["reward"] == pytest.approx(1.0)
    # 0.8 x task + 0.2 x fraction of tagged turns: format alone earns 0.2.
    wrong = _play(extras, prompt, [SFT_REPLY.format(pos=0, action="<action>stop</action>")])
    assert wrong["reward"] == pytest.approx(0.2)
