"""Shipped configs and overrides: SkyRL's sections built and validated by SkyRL's own config
classes, the ``mazes:`` and ``local:`` sections by the same checker, every error naming its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from maze_engine.config import (
    CONFIG_DIR,
    LOCAL_KEY,
    MAZES_KEY,
    REFERENCE_CONFIG,
    SMOKE_CONFIG,
    TINY_LOCAL_CONFIG,
    LocalConfig,
    LocalRayConfig,
    MazeDataConfig,
    WarmStartConfig,
    load_config,
    resolve_config_path,
    shipped_configs,
)
from maze_engine.data import eval_slack
from maze_engine.errors import ConfigError, MazeEngineError
from maze_engine.schema import LR_SCHEDULERS
from maze_env import DEFAULT_SLACK, get_eval_set


@pytest.fixture(autouse=True)
def _no_config_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("MAZERL_RUN", "MAZERL_SFT_CHECKPOINT", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)


def test_reference_config_carries_the_reference_settings() -> None:
    from skyrl.train.config import SkyRLTrainConfig

    config = load_config(REFERENCE_CONFIG)
    cfg = config.skyrl
    assert isinstance(cfg, SkyRLTrainConfig)
    assert config.local == LocalConfig()  # no `local:` section: the local engine's defaults
    assert config.mazes == MazeDataConfig(
        train_preset="easy",
        train_size=256,
        eval_set="easy-64",
        cell_px=25,
        reward_spec="visgym_sft",
    )
    assert config.source == resolve_config_path(REFERENCE_CONFIG)
    t, g = cfg.trainer, cfg.generator
    run = "/shared/runs/maze-grpo-qwen3vl8b"
    lora = t.policy.model.lora
    assert t.policy.model.path == "Qwen/Qwen3-VL-8B-Instruct"
    assert (lora.rank, lora.alpha, lora.target_modules) == (32, 64, "all-linear")
    assert lora.exclude_modules == ".*visual.*"
    assert lora.lora_sync_path == f"{run}/lora_sync"
    assert t.strategy == "fsdp"
    assert t.placement.colocate_all
    assert (t.placement.policy_num_nodes, t.placement.policy_num_gpus_per_node) == (3, 2)
    ie = g.inference_engine
    assert (ie.backend, ie.num_engines, ie.tensor_parallel_size) == ("vllm", 6, 1)
    assert ie.gpu_memory_utilization == 0.45
    assert t.algorithm.advantage_estimator == "grpo"
    assert not t.algorithm.use_kl_loss and not t.algorithm.use_kl_in_reward
    assert g.n_samples_per_prompt == 8
    assert t.train_batch_size == 32
    assert g.sampling_params.temperature == 0.7
    assert t.algorithm.temperature == 0.7  # SkyRL copies it for the loss
    assert t.policy.optimizer_config.lr == 1e-6
    assert (t.eval_interval, t.eval_before_train) == (10, True)
    assert (t.ckpt_interval, t.hf_save_interval, t.resume_mode) == (20, 20, "latest")
    assert t.ckpt_path == f"{run}/ckpt"
    assert t.export_path == run
    assert cfg.data.train_data == [f"{run}/data/train.parquet"]
    assert cfg.data.val_data == [f"{run}/data/validation.parquet"]
    assert config.data_dir == Path(f"{run}/data")
    assert cfg.environment.env_class == "maze"
    # What SkyRL 0.4's VLM generator requires.
    assert g.vision_language_generator and g.use_conversation_multi_turn
    assert not g.batched and not g.step_wise_trajectories
    assert not t.remove_microbatch_padding
    # Greedy single-sample eval: eval/all/pass_at_1 is the solve rate.
    assert g.eval_n_samples_per_prompt == 1
    assert g.eval_sampling_params is not None and g.eval_sampling_params.temperature == 0.0


def test_reference_max_turns_fits_every_easy_64_maze() -> None:
    config = load_config(REFERENCE_CONFIG)
    worst = max(m.optimal_moves for m in get_eval_set("easy-64").mazes)
    assert config.max_turns == config.skyrl.generator.max_turns == worst + 1 + DEFAULT_SLACK
    assert eval_slack(config.max_turns, "easy-64") == DEFAULT_SLACK
    # VisGym's 15 turns cannot finish the 16-move mazes.
    with pytest.raises(ConfigError, match=r"generator\.max_turns") as e:
        eval_slack(15, "easy-64")
    assert e.value.key == "generator.max_turns"
    with pytest.raises(ConfigError, match="unknown eval set") as e:
        eval_slack(21, "medium-64")
    assert e.value.key == "mazes.eval_set"
    # load_config checks the same, so a config whose eval mazes cannot be finished never loads.
    with pytest.raises(ConfigError, match="15 turns cannot finish") as e:
        load_config(REFERENCE_CONFIG, ["generator.max_turns=15"])
    assert e.value.key == "generator.max_turns"


def test_sft_checkpoint_variable_and_run_name_override_move_every_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MAZERL_SFT_CHECKPOINT", "/shared/models/visgym-sft")
    config = load_config(REFERENCE_CONFIG, ["trainer.run_name=exp2", "trainer.epochs=3"])
    cfg = config.skyrl
    assert cfg.trainer.policy.model.path == "/shared/models/visgym-sft"
    assert cfg.trainer.ref.model.path == "/shared/models/visgym-sft"
    assert cfg.trainer.epochs == 3
    assert cfg.trainer.ckpt_path == "/shared/runs/exp2/ckpt"
    assert cfg.trainer.policy.model.lora.lora_sync_path == "/shared/runs/exp2/lora_sync"
    assert cfg.data.val_data == ["/shared/runs/exp2/data/validation.parquet"]
    assert config.data_dir == Path("/shared/runs/exp2/data")


def test_overrides_reach_nested_and_dict_fields() -> None:
    cfg = load_config(
        REFERENCE_CONFIG,
        [
            "generator.n_samples_per_prompt=12",
            "trainer.policy.model.lora.rank=16",
            "generator.inference_engine.engine_init_kwargs.max_model_len=8192",
            "trainer.resume_mode=null",
            "data.val_data=[/shared/a.parquet,/shared/b.parquet]",
        ],
    ).skyrl
    assert cfg.generator.n_samples_per_prompt == 12
    assert cfg.trainer.policy.model.lora.rank == 16
    assert cfg.generator.inference_engine.engine_init_kwargs == {"max_model_len": 8192}
    assert cfg.trainer.resume_mode is None
    assert cfg.data.val_data == ["/shared/a.parquet", "/shared/b.parquet"]


def test_smoke_config_validates_and_keeps_its_own_sections_out_of_skyrl() -> None:
    config = load_config(
        SMOKE_CONFIG, ["local.warm_start.steps=3", "local.warm_start.max_seconds=30"]
    )
    assert config.mazes == MazeDataConfig(
        train_preset="5x5",
        eval_set="tiny-64",
        cell_px=32,
        reward_spec="task",
        allow_eval_overlap=True,
    )
    assert config.local == LocalConfig(
        rollout_workers=2, warm_start=WarmStartConfig(steps=3, max_seconds=30)
    )
    cfg = config.skyrl
    assert not hasattr(cfg, LOCAL_KEY) and not hasattr(cfg, MAZES_KEY)
    assert cfg.generator.n_samples_per_prompt == 8
    assert cfg.trainer.policy.model.lora.rank == 8
    assert cfg.trainer.train_batch_size == 4
    assert cfg.environment.env_class == "maze"
    # The eval set's slack is derived from generator.max_turns: every eval maze gets a budget of
    # at most max_turns, exactly as on the cluster (tiny-64: 4 moves + stop + 2 = 7).
    assert eval_slack(config.max_turns, config.mazes.eval_set) == 2
    assert SMOKE_CONFIG in shipped_configs() and REFERENCE_CONFIG in shipped_configs()
    assert TINY_LOCAL_CONFIG in shipped_configs()


def test_local_ray_places_the_rollout_workers_by_custom_resources(tmp_path: Path) -> None:
    assert load_config(SMOKE_CONFIG).local.ray == LocalRayConfig({}, 600.0)
    config = load_config(
        SMOKE_CONFIG,
        [
            "local.ray.worker_resources={rollout_node: 1, gpu: 0.5}",
            "local.ray.start_timeout_s=null",
        ],
    )
    assert config.local.ray == LocalRayConfig({"rollout_node": 1, "gpu": 0.5}, None)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        (CONFIG_DIR / "tiny_local.yaml").read_text()
        + "  ray:\n    worker_resources: {rollout_node: 2}\n"
    )
    assert load_config(cfg).local.ray.worker_resources == {"rollout_node": 2}


@pytest.mark.parametrize(
    ("override", "key", "fragment"),
    [
        ("local.note=hello", "local.note", "unknown key, not in mazerl's config"),
        ("local.sft_steps=3", "local.sft_steps", "unknown key"),  # now local.warm_start.steps
        ("local.slack=2", "local.slack", "unknown key"),  # derived from generator.max_turns
        ("local.train_preset=7x7", "local.train_preset", "unknown key"),  # now mazes.*
        ("local.warm_start.stpes=3", "local.warm_start.stpes", "'local.warm_start.steps'"),
        ("mazes.train_szie=8", "mazes.train_szie", "'mazes.train_size'"),
        ("local.rollout_workers=-1", "local.rollout_workers", "must be an int >= 0"),
        ("local.torch_threads=two", "local.torch_threads", "is not an int"),
        ("local.prometheus_port=70000", "local.prometheus_port", "port number"),
        ("local.warm_start.steps=-1", "local.warm_start.steps", "must be an int >= 0"),
        ("local.warm_start.lr=0", "local.warm_start.lr", "must be > 0"),
        ("local.warm_start.max_seconds=0", "local.warm_start.max_seconds", "> 0 or null"),
        ("local.warm_start.decision_weight=0.5", "local.warm_start.decision_weight", ">= 1"),
        ("local.warm_start.decision_weight=.nan", "local.warm_start.decision_weight", ">= 1"),
        ("local.warm_start.track_every=-1", "local.warm_start.track_every", "an int >= 0"),
        ("local.tiny_model.hidden_sizee=8", "local.tiny_model.hidden_sizee", "unknown key"),
        (
            "local.ray.worker_resorces.x=1",
            "local.ray.worker_resorces",
            "'local.ray.worker_resources'",
        ),
        ("local.ray.worker_resources=3", "local.ray.worker_resources", "3 is not a mapping"),
        (
            "local.ray.worker_resources.CPU=1",
            "local.ray.worker_resources.CPU",
            "custom Ray resource",
        ),
        (
            "local.ray.worker_resources={a-b: 1}",
            "local.ray.worker_resources.a-b",
            "custom Ray resource",
        ),
        (
            "local.ray.worker_resources.gpu_node=0",
            "local.ray.worker_resources.gpu_node",
            "number > 0",
        ),
        (
            "local.ray.worker_resources.gpu_node=x",
            "local.ray.worker_resources.gpu_node",
            "number > 0",
        ),
        ("local.ray.start_timeout_s=0", "local.ray.start_timeout_s", "> 0 seconds or null"),
        ("mazes.train_size=0", "mazes.train_size", "must be an int >= 1"),
        ("mazes.cell_px=2", "mazes.cell_px", "must be an int >= 4"),
        ("mazes.train_preset=huge", "mazes.train_preset", "huge"),
        ("mazes.allow_eval_overlap=3", "mazes.allow_eval_overlap", "3 is not a bool"),
        ("local.perception.route_share=1.5", "local.perception.route_share", "within 0..1"),
        (
            "local.perception.route_stop_share=-0.5",
            "local.perception.route_stop_share",
            "within 0..1",
        ),
        ("local.route_stop_share=1.5", "local.route_stop_share", "within 0..1"),
        ("local.route_stop_share=.nan", "local.route_stop_share", "within 0..1"),
        ("local.route_stop_share=true", "local.route_stop_share", "true is not a float"),
        (
            "local.warm_start.route_stop_share=-0.1",
            "local.warm_start.route_stop_share",
            "within 0..1",
        ),
        ("local.perception.route_specs=[]", "local.perception.route_specs", "at least one"),
        ("local.perception.route_specs=[4x4]", "local.perception.route_specs", "odd"),
        ("local.step_advantage_weight=-1", "local.step_advantage_weight", "must be >= 0"),
        (
            "local.step_advantage_weight=1",
            "local.step_advantage_weight",
            "context=latest, recent, route or route-recent",
        ),
        ("local.progress_advantage_weight=-1", "local.progress_advantage_weight", "must be >= 0"),
        (
            "local.progress_advantage_weight=1",
            "local.progress_advantage_weight",
            "context=latest, recent, route or route-recent",
        ),
        ("local.off_goal_stop_penalty=-1", "local.off_goal_stop_penalty", "must be >= 0"),
        (
            "local.off_goal_stop_penalty=1",
            "local.off_goal_stop_penalty",
            "set local.progress_advantage_weight > 0",
        ),
        ("local.step_advantage_gamma=0", "local.step_advantage_gamma", "in (0, 1]"),
        ("local.step_advantage_gamma=1.5", "local.step_advantage_gamma", "in (0, 1]"),
    ],
)
def test_local_and_mazes_errors_name_the_key_and_where_it_was_set(
    override: str, key: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(SMOKE_CONFIG, [override])
    assert e.value.key == key
    assert str(e.value).startswith(f"{key}: ")
    assert fragment in str(e.value)
    assert e.value.source == f"override {override.split('=', maxsplit=1)[0]}=..."
    assert isinstance(e.value, MazeEngineError) and isinstance(e.value, ValueError)


@pytest.mark.parametrize(
    ("override", "key", "allowed"),
    [
        ("mazes.eval_set=medium-64", "mazes.eval_set", "easy-64"),
        ("mazes.reward_spec=shiny", "mazes.reward_spec", "visgym_sft"),
        ("mazes.report_sets=[easy-64,medium-64]", "mazes.report_sets", "hard-64"),
        ("local.warm_start.demonstrator=teacher", "local.warm_start.demonstrator", "explorer"),
        ("local.warm_start.reply=json", "local.warm_start.reply", "action"),
        ("local.perception.route_eval_set=x-64", "local.perception.route_eval_set", "small-64"),
        ("local.context=window", "local.context", "latest"),
    ],
)
def test_mazes_choices_name_the_allowed_values(override: str, key: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(SMOKE_CONFIG, [override])
    assert e.value.key == key
    assert e.value.allowed is not None and allowed in e.value.allowed
    assert "allowed values:" in str(e.value)


def test_bad_value_in_the_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("mazes:\n  train_size: 0\n", encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.key == "mazes.train_size"
    assert e.value.source == str(path)


def test_yaml_may_use_dotted_keys(tmp_path: Path) -> None:
    path = tmp_path / "dotted.yaml"
    path.write_text(
        "trainer.epochs: 7\n"
        "trainer.logger: console\n"
        "trainer:\n  train_batch_size: 8\n  policy_mini_batch_size: 8\n"
        "trainer.placement.colocate_all: false\n"
        "generator.n_samples_per_prompt: 2\n"
        "generator.max_turns: 21\n"  # easy-64, the default eval set, needs 17
        "mazes.train_size: 16\n"
        "local:\n  torch_threads: 2\n  warm_start.steps: 5\n",
        encoding="utf-8",
    )
    config = load_config(path)
    cfg = config.skyrl
    assert (cfg.trainer.epochs, cfg.trainer.train_batch_size) == (7, 8)
    assert not cfg.trainer.placement.colocate_all
    assert cfg.generator.n_samples_per_prompt == 2
    assert config.mazes == MazeDataConfig(train_size=16)
    assert config.local == LocalConfig(torch_threads=2, warm_start=WarmStartConfig(steps=5))


@pytest.mark.parametrize(
    ("override", "key", "hint"),
    [
        ("trainer.polcy.model.path=x", "trainer.polcy", "'trainer.policy'"),
        (
            "trainer.policy.model.lora.rnk=8",
            "trainer.policy.model.lora.rnk",
            "'trainer.policy.model.lora.rank'",
        ),
        ("generator.max_turn=5", "generator.max_turn", "'generator.max_turns'"),
        ("foo=1", "foo", "'mazes:'"),
        ("foo=1", "foo", "'local:'"),
    ],
)
def test_unknown_key_is_named_with_suggestions(override: str, key: str, hint: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(REFERENCE_CONFIG, [override])
    assert e.value.key == key
    assert str(e.value).startswith(f"{key}: unknown key")
    assert hint in str(e.value)
    assert f"override {override.split('=', maxsplit=1)[0]}" in str(e.value)


@pytest.mark.parametrize(
    ("override", "key", "allowed"),
    [
        ("trainer.strategy=fsdq", "trainer.strategy", ("fsdp", "megatron")),
        (
            "trainer.resume_mode=sometimes",
            "trainer.resume_mode",
            ("latest", "none", "from_path", None),
        ),
        (
            "trainer.logger=stdout",
            "trainer.logger",
            ("wandb", "mlflow", "swanlab", "tensorboard", "console"),
        ),
        (
            "trainer.policy.model.lora.sync_mode=nfs",
            "trainer.policy.model.lora.sync_mode",
            ("disk", "memory"),
        ),
        (  # needs a metric to step on, which SkyRL's worker never passes
            "trainer.policy.optimizer_config.scheduler=reduce_lr_on_plateau",
            "trainer.policy.optimizer_config.scheduler",
            LR_SCHEDULERS,
        ),
    ],
)
def test_bad_choice_names_key_and_allowed_values(
    override: str, key: str, allowed: tuple[object, ...]
) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(REFERENCE_CONFIG, [override])
    assert e.value.key == key
    assert e.value.allowed == allowed
    assert "allowed values:" in str(e.value)


def test_registry_choices_come_from_skyrl() -> None:
    from skyrl.backends.skyrl_train.utils.ppo_utils import AdvantageEstimatorRegistry

    with pytest.raises(ConfigError) as e:
        load_config(REFERENCE_CONFIG, ["trainer.algorithm.advantage_estimator=ppo2"])
    assert e.value.key == "trainer.algorithm.advantage_estimator"
    assert e.value.allowed is not None
    assert set(e.value.allowed) == set(AdvantageEstimatorRegistry.list_available())
    assert "grpo" in e.value.allowed


@pytest.mark.parametrize(
    ("override", "key", "message"),
    [
        ("trainer.train_batch_size=abc", "trainer.train_batch_size", "'abc' is not an int"),
        ("trainer.eval_before_train=3", "trainer.eval_before_train", "3 is not a bool"),
        ("trainer.placement=3", "trainer.placement", "must be a section"),
        ("trainer.policy.model.lora.rank=null", "trainer.policy.model.lora.rank", "not null"),
        ("data.train_data=/one/file.parquet", "data.train_data", "is not a list of str"),
    ],
)
def test_wrong_type_names_key(override: str, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(REFERENCE_CONFIG, [override])
    assert e.value.key == key
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("generator.batched=true", "generator.batched"),
        ("generator.use_conversation_multi_turn=false", "generator.use_conversation_multi_turn"),
        ("trainer.remove_microbatch_padding=true", "trainer.remove_microbatch_padding"),
    ],
)
def test_vlm_generator_requirements(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match="vision_language_generator") as e:
        load_config(REFERENCE_CONFIG, [override])
    assert e.value.key == key


@pytest.mark.parametrize(
    ("override", "key", "fragment"),
    [
        ("trainer.policy_mini_batch_size=5", "trainer.policy_mini_batch_size", "divisible"),
        (
            "generator.inference_engine.num_engines=4",
            "generator.inference_engine.num_engines",
            "num_rollout_gpus",
        ),
        ("trainer.logger=wandb", "trainer.logger", "WANDB_API_KEY"),
    ],
)
def test_skyrl_validate_cfg_errors_are_attributed(override: str, key: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match="validate_cfg") as e:
        load_config(REFERENCE_CONFIG, [override])
    assert e.value.key == key
    assert fragment in str(e.value)
    # Without SkyRL's cross-field validation the same config builds.
    config = load_config(REFERENCE_CONFIG, [override], validate=False)
    assert config.skyrl.trainer.strategy == "fsdp"


def test_bad_files_and_overrides(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found") as e:
        load_config(tmp_path / "nope.yaml")
    assert e.value.allowed is not None and REFERENCE_CONFIG in e.value.allowed
    broken = tmp_path / "broken.yaml"
    broken.write_text("trainer: [unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="cannot read config") as e:
        load_config(broken)
    assert str(broken) in str(e.value)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(listy)
    bad_local = tmp_path / "local.yaml"
    bad_local.write_text("local: 3\n", encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_config(bad_local)
    assert e.value.key == LOCAL_KEY
    bad_mazes = tmp_path / "mazes.yaml"
    bad_mazes.write_text("mazes: [easy]\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="must be a mapping") as e:
        load_config(bad_mazes)
    assert e.value.key == MAZES_KEY
    missing_env = tmp_path / "env.yaml"
    missing_env.write_text(
        "trainer:\n  run_name: ${oc.env:MAZERL_SURELY_UNSET_VAR}\n", encoding="utf-8"
    )
    with pytest.raises(ConfigError, match="MAZERL_SURELY_UNSET_VAR") as e:
        load_config(missing_env)
    assert e.value.key == "trainer.run_name"
    for override, fragment in [
        ("trainer.epochs", "is not key=value"),
        ("+trainer.new_key=1", "not supported"),
        ("trainer..epochs=1", "not a dotted key"),
    ]:
        with pytest.raises(ConfigError, match=fragment):
            load_config(REFERENCE_CONFIG, [override])


def test_shipped_name_resolution() -> None:
    path = resolve_config_path(REFERENCE_CONFIG)
    assert path == resolve_config_path(f"{REFERENCE_CONFIG}.yaml")
    assert path.is_file() and path.parent.name == "configs"
