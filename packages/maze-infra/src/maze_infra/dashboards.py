"""Grafana dashboards as code: build, check and push the mazerl dashboards.

Three dashboards are generated with grafana-foundation-sdk and written as stable JSON (sorted
keys, two-space indent) into ``dashboards/`` at the repo root, beside Grafana file-provisioning
YAML:

- ``mazerl-training.json``: the trainer's ``mazerl_*`` gauges (both engines export SkyRL's
  metric keys under the same names; :func:`maze_engine.metrics.prometheus_name`);
- ``mazerl-serving.json``: ``maze-serve``'s ``maze_serving_*`` metrics;
- ``mazerl-cluster.json``: Ray's node metrics and vLLM's engine metrics, under their own names.

Every panel queries the data source chosen by the ``datasource`` template variable (any
Prometheus-type source: a Prometheus server or Amazon Managed Service for Prometheus), so the
same JSON loads into Grafana and Amazon Managed Grafana. ``push`` uploads the files through
Grafana's HTTP API with grafana-client (``GRAFANA_URL``, ``GRAFANA_TOKEN``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from maze_infra.errors import (
    CredentialsError,
    MissingExtraError,
    OperationError,
    ServiceUnreachableError,
    SpecError,
)

EXTRA_HINT = "pip install 'maze-infra[dashboards]'"
PUSH_EXTRA_HINT = "pip install 'maze-infra[grafana]'"
DEFAULT_DIR = Path("dashboards")
"""Where ``build`` writes and ``check``/``push`` read, relative to the working directory."""
DEFAULT_FOLDER = "mazerl"
PUSH_TIMEOUT_S = 10.0
"""Per-request timeout of ``push``: an unreachable Grafana fails in bounded time."""
TAG = "mazerl"

DATASOURCE_VAR = "datasource"
JOB_VAR = "job"
VLLM_PREFIX_VAR = "vllm_prefix"
VLLM_PREFIXES = ("vllm:", "ray_vllm_")
"""vLLM's own server names its metrics ``vllm:*``; engines inside Ray (as SkyRL runs them)
export the same metrics through Ray as ``ray_vllm_*``."""

RATE = "$__rate_interval"
JOB = f'job=~"${JOB_VAR}"'
VLLM = f"${{{VLLM_PREFIX_VAR}}}"

Unit = Literal["short", "s", "percent", "percentunit", "bytes", "Bps", "reqps"]


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel and its legend."""

    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    """A time series (or, with ``stat``, a single-value) panel."""

    title: str
    description: str
    targets: tuple[Target, ...]
    unit: Unit = "short"
    stat: bool = False
    width: int = 8
    stacked: bool = False
    min: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class Row:
    """A titled row of panels."""

    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Dashboard:
    """What one generated dashboard holds; :func:`dashboard_json` turns it into Grafana JSON."""

    file: str
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    job_metric: str | None = None
    """Metric whose ``job`` label values fill the ``job`` variable; None: no such variable."""
    vllm_prefix: bool = False
    """Add the ``vllm_prefix`` variable (see :data:`VLLM_PREFIXES`)."""


def _g(name: str) -> str:
    """A training gauge filtered by the ``job`` variable."""
    return f"{name}{{{JOB}}}"


def _quantiles(bucket: str, qs: tuple[float, ...], by: str = "le") -> tuple[Target, ...]:
    return tuple(
        Target(
            f"histogram_quantile({q}, sum by ({by}) (rate({bucket}[{RATE}])))",
            f"p{round(q * 100)}",
        )
        for q in qs
    )


TRAINING = Dashboard(
    file="mazerl-training.json",
    uid="mazerl-training",
    title="mazerl / training",
    description="GRPO + LoRA training: the local engine's and the SkyRL cluster run's metrics "
    "(SkyRL's keys as mazerl_* gauges).",
    job_metric="mazerl_global_step",
    rows=(
        Row(
            "Learning",
            (
                Panel(
                    "Reward",
                    "Mean raw reward of the step's sampled episodes (reward/avg_raw_reward).",
                    (Target(_g("mazerl_reward_avg_raw_reward"), "mean reward {{job}}"),),
                ),
                Panel(
                    "Eval solve rate",
                    "Greedy solve rate on the fixed eval set (eval/all/pass_at_1), at each "
                    "trainer.eval_interval.",
                    (Target(_g("mazerl_eval_all_pass_at_1"), "eval pass@1 {{job}}"),),
                    unit="percentunit",
                    min=0,
                    max=1,
                ),
                Panel(
                    "pass@k (sampled)",
                    "Share of prompts with at least one solved sample among k "
                    "(reward/avg_pass_at_<k>; k = 1 and n_samples_per_prompt).",
                    (
                        Target(
                            f'{{__name__=~"mazerl_reward_avg_pass_at_[0-9]+", {JOB}}}',
                            "{{__name__}} {{job}}",
                        ),
                    ),
                    unit="percentunit",
                    min=0,
                    max=1,
                ),
            ),
        ),
        Row(
            "Policy",
            (
                Panel(
                    "KL to the reference",
                    "policy/policy_kl: logged (as SkyRL does) when "
                    "trainer.algorithm.use_kl_loss is on.",
                    (Target(_g("mazerl_policy_policy_kl"), "KL {{job}}"),),
                    width=6,
                ),
                Panel(
                    "Entropy",
                    "Mean token entropy of the policy on the step's episodes "
                    "(policy/policy_entropy).",
                    (Target(_g("mazerl_policy_policy_entropy"), "entropy {{job}}"),),
                    width=6,
                ),
                Panel(
                    "Gradient norm",
                    "Gradient norm before clipping (policy/grad_norm).",
                    (Target(_g("mazerl_policy_grad_norm"), "grad norm {{job}}"),),
                    width=6,
                ),
                Panel(
                    "Policy loss",
                    "policy/policy_loss (the clipped surrogate, before KL and entropy terms).",
                    (Target(_g("mazerl_policy_policy_loss"), "loss {{job}}"),),
                    width=6,
                ),
            ),
        ),
        Row(
            "Step time",
            (
                Panel(
                    "Step time",
                    "Wall time of one GRPO step (timing/step).",
                    (Target(_g("mazerl_timing_step"), "step {{job}}"),),
                    unit="s",
                    width=12,
                ),
                Panel(
                    "Step phases",
                    "Rollouts (timing/generate), policy update (timing/policy_train) and "
                    "adapter publish + load (timing/sync_weights), stacked.",
                    (
                        Target(_g("mazerl_timing_generate"), "generate {{job}}"),
                        Target(_g("mazerl_timing_policy_train"), "policy update {{job}}"),
                        Target(_g("mazerl_timing_sync_weights"), "weight sync {{job}}"),
                    ),
                    unit="s",
                    width=12,
                    stacked=True,
                ),
            ),
        ),
        Row(
            "Weight sync",
            (
                Panel(
                    "Adapter publish and hand-over",
                    "weight_sync/publish_s: writing and publishing the adapter version; "
                    "weight_sync/handover_s: the rollout workers (local) or vLLM engines "
                    "(cluster) loading it.",
                    (
                        Target(_g("mazerl_weight_sync_publish_s"), "publish {{job}}"),
                        Target(_g("mazerl_weight_sync_handover_s"), "hand-over {{job}}"),
                    ),
                    unit="s",
                    width=12,
                ),
                Panel(
                    "Adapter version",
                    "weight-sync version the rollouts now sample from (adapter/version).",
                    (Target(_g("mazerl_adapter_version"), "{{job}}"),),
                    stat=True,
                    width=6,
                ),
                Panel(
                    "Global step",
                    "The trainer's global step.",
                    (Target(_g("mazerl_global_step"), "{{job}}"),),
                    stat=True,
                    width=6,
                ),
            ),
        ),
        Row(
            "Rollouts",
            (
                Panel(
                    "Rollout throughput",
                    "Generated tokens and episode turns per second of rollout time "
                    "(rollout/tokens_per_second, rollout/turns_per_second).",
                    (
                        Target(_g("mazerl_rollout_tokens_per_second"), "tokens/s {{job}}"),
                        Target(_g("mazerl_rollout_turns_per_second"), "turns/s {{job}}"),
                    ),
                    width=12,
                ),
                Panel(
                    "Turns per episode",
                    "Mean turns of the step's episodes (rollout/avg_turns).",
                    (Target(_g("mazerl_rollout_avg_turns"), "turns {{job}}"),),
                    width=12,
                ),
            ),
        ),
        Row(
            "Checkpoints",
            (
                Panel(
                    "Checkpoint age",
                    "Time since the newest checkpoint was written "
                    "(checkpoint/last_saved_unixtime).",
                    (
                        Target(
                            f"time() - {_g('mazerl_checkpoint_last_saved_unixtime')}",
                            "{{job}}",
                        ),
                    ),
                    unit="s",
                    stat=True,
                ),
                Panel(
                    "Resumes",
                    "How many times this run resumed from a checkpoint (checkpoint/resumes).",
                    (Target(_g("mazerl_checkpoint_resumes"), "{{job}}"),),
                    stat=True,
                ),
                Panel(
                    "Checkpoint save time",
                    "Wall time of the latest checkpoint save (timing/save_checkpoint).",
                    (Target(_g("mazerl_timing_save_checkpoint"), "save {{job}}"),),
                    unit="s",
                ),
            ),
        ),
    ),
)


def _srv(name: str, extra: str = "") -> str:
    """A maze-serve series filtered by the ``job`` variable (and ``extra`` matchers)."""
    return f"{name}{{{JOB}{', ' + extra if extra else ''}}}"


_REQUESTS = _srv("maze_serving_requests_total")
_ERRORS = _srv("maze_serving_requests_total", 'status=~"[45].."')

SERVING = Dashboard(
    file="mazerl-serving.json",
    uid="mazerl-serving",
    title="mazerl / serving",
    description="maze-serve: OpenAI-compatible and SageMaker serving of the trained adapter.",
    job_metric="maze_serving_num_requests_running",
    rows=(
        Row(
            "Traffic",
            (
                Panel(
                    "Requests by endpoint",
                    "HTTP requests per second by path (maze_serving_requests_total).",
                    (
                        Target(
                            f"sum by (endpoint) (rate({_REQUESTS}[{RATE}]))",
                            "{{endpoint}}",
                        ),
                    ),
                    unit="reqps",
                ),
                Panel(
                    "Errors by status code",
                    "4xx and 5xx answers per second by status code.",
                    (Target(f"sum by (status) (rate({_ERRORS}[{RATE}]))", "{{status}}"),),
                    unit="reqps",
                ),
                Panel(
                    "Error ratio",
                    "Share of requests answered with 4xx or 5xx.",
                    (
                        Target(
                            f"(sum(rate({_ERRORS}[{RATE}])) or vector(0)) / "
                            f"sum(rate({_REQUESTS}[{RATE}]))",
                            "errors",
                        ),
                    ),
                    unit="percentunit",
                    stat=True,
                ),
            ),
        ),
        Row(
            "Latency",
            (
                Panel(
                    "End-to-end latency",
                    "Quantiles of generation requests' latency "
                    "(maze_serving_e2e_request_latency_seconds).",
                    _quantiles(
                        _srv("maze_serving_e2e_request_latency_seconds_bucket"), (0.5, 0.9, 0.99)
                    ),
                    unit="s",
                ),
                Panel(
                    "Time to first token",
                    "Quantiles of streamed requests' time to the first token "
                    "(maze_serving_time_to_first_token_seconds).",
                    _quantiles(
                        _srv("maze_serving_time_to_first_token_seconds_bucket"), (0.5, 0.99)
                    ),
                    unit="s",
                ),
                Panel(
                    "Batch size",
                    "Mean requests per batched generate call (maze_serving_batch_size).",
                    (
                        Target(
                            f"sum(rate({_srv('maze_serving_batch_size_sum')}[{RATE}])) / "
                            f"sum(rate({_srv('maze_serving_batch_size_count')}[{RATE}]))",
                            "mean batch",
                        ),
                    ),
                ),
            ),
        ),
        Row(
            "Load",
            (
                Panel(
                    "Requests running and waiting",
                    "Admitted generation requests (maze_serving_num_requests_running) and "
                    "those queued for the next batch (maze_serving_num_requests_waiting).",
                    (
                        Target(f"sum({_srv('maze_serving_num_requests_running')})", "admitted"),
                        Target(f"sum({_srv('maze_serving_num_requests_waiting')})", "waiting"),
                    ),
                    width=12,
                ),
                Panel(
                    "Tokens per second",
                    "Prompt tokens processed and tokens generated per second.",
                    (
                        Target(
                            f"sum(rate({_srv('maze_serving_prompt_tokens_total')}[{RATE}]))",
                            "prompt",
                        ),
                        Target(
                            f"sum(rate({_srv('maze_serving_generation_tokens_total')}[{RATE}]))",
                            "generation",
                        ),
                    ),
                    width=12,
                ),
            ),
        ),
        Row(
            "Adapters",
            (
                Panel(
                    "Served adapter version",
                    "weight-sync version served (maze_serving_active_adapter_version; "
                    "-1 before the first).",
                    (Target(_srv("maze_serving_active_adapter_version"), "{{instance}}"),),
                    stat=True,
                    width=6,
                ),
                Panel(
                    "Adapters loaded",
                    "LoRA adapters held in memory (maze_serving_adapters_loaded).",
                    (Target(_srv("maze_serving_adapters_loaded"), "{{instance}}"),),
                    stat=True,
                    width=6,
                ),
                Panel(
                    "Adapter reloads",
                    "Reloads by source (watch: a followed weight-sync store; in_place: "
                    "POST /skyrl/v1/load_lora_adapter), and those refused or failed.",
                    (
                        Target(
                            "sum by (source) (increase("
                            f"{_srv('maze_serving_adapter_reloads_total')}[{RATE}]))",
                            "{{source}}",
                        ),
                        Target(
                            "sum by (source) (increase("
                            f"{_srv('maze_serving_adapter_reload_failures_total')}[{RATE}]))",
                            "failed {{source}}",
                        ),
                    ),
                    width=12,
                ),
            ),
        ),
    ),
)

CLUSTER = Dashboard(
    file="mazerl-cluster.json",
    uid="mazerl-cluster",
    title="mazerl / cluster",
    description="The Ray cluster's nodes (Ray's metrics) and the vLLM rollout engines "
    "(vLLM's metrics).",
    vllm_prefix=True,
    rows=(
        Row(
            "Ray nodes",
            (
                Panel(
                    "CPU utilisation",
                    "ray_node_cpu_utilization per node.",
                    (Target("avg by (instance) (ray_node_cpu_utilization)", "{{instance}}"),),
                    unit="percent",
                ),
                Panel(
                    "GPU utilisation",
                    "ray_node_gpus_utilization per GPU.",
                    (
                        Target(
                            "avg by (instance, GpuIndex) (ray_node_gpus_utilization)",
                            "{{instance}} GPU {{GpuIndex}}",
                        ),
                    ),
                    unit="percent",
                ),
                Panel(
                    "GPU memory used",
                    "ray_node_gram_used per GPU (Ray reports MiB).",
                    (
                        Target(
                            "sum by (instance, GpuIndex) (ray_node_gram_used) * 1048576",
                            "{{instance}} GPU {{GpuIndex}}",
                        ),
                    ),
                    unit="bytes",
                ),
                Panel(
                    "Host memory used",
                    "ray_node_mem_used over ray_node_mem_total per node.",
                    (
                        Target(
                            "sum by (instance) (ray_node_mem_used) / "
                            "sum by (instance) (ray_node_mem_total)",
                            "{{instance}}",
                        ),
                    ),
                    unit="percentunit",
                    width=12,
                    min=0,
                    max=1,
                ),
                Panel(
                    "Network",
                    "ray_node_network_receive_speed and ray_node_network_send_speed per node.",
                    (
                        Target(
                            "sum by (instance) (ray_node_network_receive_speed)",
                            "{{instance}} in",
                        ),
                        Target(
                            "sum by (instance) (ray_node_network_send_speed)", "{{instance}} out"
                        ),
                    ),
                    unit="Bps",
                    width=12,
                ),
            ),
        ),
        Row(
            "vLLM engines",
            (
                Panel(
                    "Requests running and waiting",
                    "num_requests_running and num_requests_waiting per served model.",
                    (
                        Target(
                            f"sum by (model_name) ({VLLM}num_requests_running)",
                            "running {{model_name}}",
                        ),
                        Target(
                            f"sum by (model_name) ({VLLM}num_requests_waiting)",
                            "waiting {{model_name}}",
                        ),
                    ),
                ),
                Panel(
                    "KV cache usage",
                    "kv_cache_usage_perc (1 = full), the fullest engine per model.",
                    (Target(f"max by (model_name) ({VLLM}kv_cache_usage_perc)", "{{model_name}}"),),
                    unit="percentunit",
                    min=0,
                    max=1,
                ),
                Panel(
                    "Token throughput",
                    "Prompt and generated tokens per second (prompt_tokens_total, "
                    "generation_tokens_total).",
                    (
                        Target(f"sum(rate({VLLM}prompt_tokens_total[{RATE}]))", "prompt"),
                        Target(f"sum(rate({VLLM}generation_tokens_total[{RATE}]))", "generation"),
                    ),
                ),
                Panel(
                    "End-to-end latency",
                    "Quantiles of e2e_request_latency_seconds.",
                    _quantiles(f"{VLLM}e2e_request_latency_seconds_bucket", (0.5, 0.99)),
                    unit="s",
                ),
                Panel(
                    "Time to first token",
                    "Quantiles of time_to_first_token_seconds.",
                    _quantiles(f"{VLLM}time_to_first_token_seconds_bucket", (0.5, 0.99)),
                    unit="s",
                ),
                Panel(
                    "Preemptions",
                    "Requests preempted per second (num_preemptions_total).",
                    (Target(f"sum(rate({VLLM}num_preemptions_total[{RATE}]))", "preemptions"),),
                ),
            ),
        ),
    ),
)

DASHBOARDS = (TRAINING, SERVING, CLUSTER)

PROVIDER_YAML = """\
# Grafana file provisioning of the mazerl dashboards (written by `maze-infra dashboards build`).
# Mount dashboards/provisioning/ as /etc/grafana/provisioning/ and dashboards/ itself (the
# mazerl-*.json files) at the path below, e.g.
#   docker run -v "$PWD/dashboards:/var/lib/grafana/dashboards/mazerl:ro" \\
#     -v "$PWD/dashboards/provisioning:/etc/grafana/provisioning:ro" grafana/grafana
apiVersion: 1
providers:
  - name: mazerl
    orgId: 1
    folder: mazerl
    type: file
    disableDeletion: false
    # The JSON files are the source of truth: edits in the UI are not saved back.
    allowUiUpdates: false
    updateIntervalSeconds: 60
    options:
      path: /var/lib/grafana/dashboards/mazerl
      foldersFromFilesStructure: false
"""

DATASOURCE_YAML = """\
# A Prometheus data source for the mazerl dashboards (written by `maze-infra dashboards build`).
# The dashboards pick their source through the `datasource` variable, so any Prometheus-type
# source works; this one is the default.
apiVersion: 1
datasources:
  - name: Prometheus
    type: prometheus
    uid: mazerl-prometheus
    access: proxy
    # Placeholder: replace with your Prometheus, e.g. http://prometheus-server.monitoring:9090
    # in the cluster, or an Amazon Managed Service for Prometheus workspace's query URL
    # (https://aps-workspaces.<region>.amazonaws.com/workspaces/<id>) with the sigV4 lines below.
    url: http://prometheus.example.invalid:9090
    isDefault: true
    editable: false
    jsonData:
      # The scrape interval: Grafana's $__rate_interval is built from it.
      timeInterval: 15s
      # sigV4Auth: true
      # sigV4AuthType: default
      # sigV4Region: us-east-1
"""

PROVISIONING = {
    "provisioning/dashboards/mazerl.yaml": PROVIDER_YAML,
    "provisioning/datasources/prometheus.yaml": DATASOURCE_YAML,
}


# ----------------------------------------------------------------------------------- build


def _sdk() -> Any:
    """The grafana-foundation-sdk modules this module uses, imported on first use."""
    import warnings
    from types import SimpleNamespace

    try:
        with warnings.catch_warnings():
            # Its v1 dashboard builder warns that a v2 schema exists; v1 is what Grafana's
            # /api/dashboards/db and file provisioning take everywhere (Amazon Managed Grafana
            # included).
            warnings.simplefilter("ignore", DeprecationWarning)
            from grafana_foundation_sdk.builders import common as cb
            from grafana_foundation_sdk.builders import dashboard as db
            from grafana_foundation_sdk.builders import prometheus, stat, timeseries
            from grafana_foundation_sdk.cog.encoder import JSONEncoder
            from grafana_foundation_sdk.models import common
            from grafana_foundation_sdk.models import dashboard as dm
    except ImportError as exc:
        raise MissingExtraError(
            f"building dashboards needs grafana-foundation-sdk ({exc.name} is missing): "
            f"{EXTRA_HINT}"
        ) from exc
    return SimpleNamespace(
        cb=cb,
        db=db,
        prometheus=prometheus,
        stat=stat,
        timeseries=timeseries,
        JSONEncoder=JSONEncoder,
        common=common,
        dm=dm,
    )


def _variables(sdk: Any, spec: Dashboard, ds: Any) -> list[Any]:
    db, dm = sdk.db, sdk.dm
    out: list[Any] = [
        db.DatasourceVariable(DATASOURCE_VAR)
        .label("Data source")
        .description("Any Prometheus-type source (Prometheus, Amazon Managed Prometheus).")
        .type("prometheus")
    ]
    if spec.job_metric is not None:
        out.append(
            db.QueryVariable(JOB_VAR)
            .label("Job")
            .description(f"Scrape jobs exporting {spec.job_metric}.")
            .datasource(ds)
            .query(f"label_values({spec.job_metric}, job)")
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".+")
            .current(dm.VariableOption(selected=True, text="All", value="$__all"))
        )
    if spec.vllm_prefix:
        first = VLLM_PREFIXES[0]
        out.append(
            db.CustomVariable(VLLM_PREFIX_VAR)
            .label("vLLM metrics")
            .description(
                "vllm: for vLLM's own server, ray_vllm_ for engines exporting through Ray."
            )
            .values(",".join(VLLM_PREFIXES))
            .options(
                [dm.VariableOption(selected=p == first, text=p, value=p) for p in VLLM_PREFIXES]
            )
            .current(dm.VariableOption(selected=True, text=first, value=first))
        )
    return out


def _panel(sdk: Any, p: Panel, ds: Any, panel_id: int) -> Any:
    cb, common = sdk.cb, sdk.common
    targets = [
        sdk.prometheus.Dataquery()
        .datasource(ds)
        .expr(t.expr)
        .legend_format(t.legend or "__auto")
        .ref_id(chr(ord("A") + i))
        for i, t in enumerate(p.targets)
    ]
    if p.stat:
        b = (
            sdk.stat.Panel()
            .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
            .graph_mode(common.BigValueGraphMode.AREA)
            .height(6)
        )
    else:
        b = (
            sdk.timeseries.Panel()
            .legend(
                cb.VizLegendOptions()
                .show_legend(True)
                .display_mode(common.LegendDisplayMode.LIST)
                .placement(common.LegendPlacement.BOTTOM)
            )
            .tooltip(
                cb.VizTooltipOptions()
                .mode(common.TooltipDisplayMode.MULTI)
                .sort(common.SortOrder.DESCENDING)
            )
            .line_width(1)
            .fill_opacity(20 if p.stacked else 10)
            .height(8)
        )
        if p.stacked:
            b = b.stacking(cb.StackingConfig().mode(common.StackingMode.NORMAL))
    b = (
        b.id(panel_id)
        .title(p.title)
        .description(p.description)
        .datasource(ds)
        .targets(targets)
        .unit(p.unit)
        .span(p.width)
    )
    if p.min is not None:
        b = b.min(p.min)
    if p.max is not None:
        b = b.max(p.max)
    return b


def dashboard_json(spec: Dashboard) -> dict[str, Any]:
    """The Grafana dashboard JSON model of ``spec`` (schema v1, no ``id``: importable anywhere).

    Raises:
        MissingExtraError: grafana-foundation-sdk is not installed.
    """
    sdk = _sdk()
    ds = sdk.common.DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VAR}}}")
    b = (
        sdk.db.Dashboard(spec.title)
        .uid(spec.uid)
        .description(spec.description)
        .tags([TAG])
        .editable()
        .tooltip(sdk.dm.DashboardCursorSync.CROSSHAIR)
        .time("now-6h", "now")
        .timezone("browser")
        .refresh("30s")
        .variables(_variables(sdk, spec, ds))
        .link(
            sdk.db.DashboardLink("mazerl")
            .type(sdk.dm.DashboardLinkType.DASHBOARDS)
            .tags([TAG])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )
    panel_id = 0
    for row in spec.rows:
        panel_id += 1
        b = b.with_row(sdk.db.Row(row.title).id(panel_id))
        for p in row.panels:
            panel_id += 1
            b = b.with_panel(_panel(sdk, p, ds, panel_id))
    # A round trip through the SDK's encoder gives plain dicts (its enums become values).
    return cast(dict[str, Any], json.loads(json.dumps(b.build(), cls=sdk.JSONEncoder)))


def render(obj: dict[str, Any]) -> str:
    """Stable text of a dashboard: sorted keys, two-space indent, one trailing newline."""
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def generated_files() -> dict[str, str]:
    """Every file ``build`` writes, path relative to the output directory -> text."""
    out = {d.file: render(dashboard_json(d)) for d in DASHBOARDS}
    out.update(PROVISIONING)
    return out


def build(out_dir: Path) -> list[Path]:
    """Write the dashboards and provisioning files under ``out_dir``; returns their paths."""
    written: list[Path] = []
    for rel, text in generated_files().items():
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)  # a provisioning Grafana watching the directory never reads half a file
        written.append(path)
    return written


def stale_files(directory: Path) -> list[str]:
    """Generated files that are missing from ``directory`` or differ from the generator's."""
    out: list[str] = []
    for rel, text in generated_files().items():
        path = directory / rel
        try:
            same = path.read_text(encoding="utf-8") == text
        except OSError:
            same = False
        if not same:
            out.append(rel)
    return out


# ------------------------------------------------------------------------------------ push


def _folder_uid(name: str) -> str:
    """A folder uid from its name: lowercase letters, digits and dashes, at most 40 chars."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return (slug or "mazerl")[:40]


def load_dashboards(directory: Path) -> list[dict[str, Any]]:
    """The generated dashboards' JSON as found in ``directory``.

    Raises:
        SpecError: A file is missing, unreadable or not a dashboard.
    """
    out: list[dict[str, Any]] = []
    for spec in DASHBOARDS:
        path = directory / spec.file
        try:
            obj = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise SpecError(
                f"cannot read {path}: {exc.strerror or exc}; run maze-infra dashboards build",
                field="--dir",
            ) from exc
        except ValueError as exc:
            raise SpecError(f"{path} is not JSON: {exc}", field="--dir") from exc
        if not isinstance(obj, dict) or not isinstance(cast(Any, obj).get("uid"), str):
            raise SpecError(f"{path} is not a Grafana dashboard (no uid)", field="--dir")
        out.append(cast(dict[str, Any], obj))
    return out


def _grafana_error(exc: Exception, url: str, what: str, timeout: float) -> Exception:
    """The typed error for a failed Grafana call (see :func:`push`)."""
    import importlib

    # Imported by name: the `grafana` extra is absent where the workspace is type-checked.
    client: Any = importlib.import_module("grafana_client.client")
    status = getattr(exc, "status_code", None)
    if isinstance(exc, client.GrafanaUnauthorizedError):
        return CredentialsError(
            f"Grafana at {url} refused the token (401) while {what}: check GRAFANA_TOKEN (for "
            "Amazon Managed Grafana, a workspace service-account token)"
        )
    if isinstance(exc, client.GrafanaTimeoutError | OSError):
        return ServiceUnreachableError(
            f"cannot reach Grafana at {url} while {what} (timeout {timeout:g} s per "
            f"request): {_one_line(str(exc))}"
        )
    if isinstance(exc, client.GrafanaClientError) and status == 403:
        return CredentialsError(
            f"Grafana at {url} denied the token (403) while {what}: the token needs the "
            "Editor role (dashboards and folders write)"
        )
    if isinstance(exc, client.GrafanaClientError | client.GrafanaServerError):
        return OperationError(
            f"Grafana at {url} refused {what} ({status}): {_one_line(str(cast(Any, exc).message))}"
        )
    if isinstance(exc, client.GrafanaException):  # transport errors carry status 0
        return ServiceUnreachableError(
            f"cannot reach Grafana at {url} while {what}: {_one_line(str(exc))}"
        )
    return OperationError(f"Grafana at {url}: {what} failed: {_one_line(str(exc))}")


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def push(
    directory: Path,
    *,
    url: str,
    token: str,
    folder: str = DEFAULT_FOLDER,
    timeout: float = PUSH_TIMEOUT_S,
) -> list[str]:
    """Upload the dashboards in ``directory`` into ``folder`` (created if missing), overwriting.

    Returns one line per dashboard: its title and URL.

    Raises:
        MissingExtraError: grafana-client is not installed.
        SpecError: A dashboard file is missing or malformed.
        CredentialsError: Grafana refused the token (401, 403).
        ServiceUnreachableError: Grafana did not answer within ``timeout`` per request.
        OperationError: Grafana refused a request (other 4xx, 5xx).
    """
    dashboards = load_dashboards(directory)
    import importlib
    import warnings

    try:
        with warnings.catch_warnings():
            # grafana-client 5.1.0's sources raise a SyntaxWarning when compiled (no cached
            # bytecode): noise on the command's stderr, which is one line per error.
            warnings.simplefilter("ignore", SyntaxWarning)
            # By name: the `grafana` extra is absent where the workspace is type-checked.
            grafana_api: Any = importlib.import_module("grafana_client.api")
            grafana_exception: type[Exception] = importlib.import_module(
                "grafana_client.client"
            ).GrafanaException
    except ImportError as exc:
        raise MissingExtraError(
            f"pushing dashboards needs grafana-client ({exc.name} is missing): {PUSH_EXTRA_HINT}"
        ) from exc
    base = url.rstrip("/")
    api: Any = grafana_api.GrafanaApi.from_url(base, credential=token, timeout=timeout)
    what = "listing folders"
    try:
        folders = cast(list[dict[str, Any]], api.folder.get_all_folders())
        found = next((f for f in folders if f.get("title") == folder), None)
        if found is None:
            what = f"creating folder {folder!r}"
            found = cast(dict[str, Any], api.folder.create_folder(folder, uid=_folder_uid(folder)))
        folder_uid = str(found["uid"])
        lines: list[str] = []
        for dash in dashboards:
            what = f"saving dashboard {dash['uid']!r}"
            body = {
                "dashboard": {**dash, "id": None},
                "folderUid": folder_uid,
                "overwrite": True,
                "message": "maze-infra dashboards push",
            }
            saved = cast(dict[str, Any], api.dashboard.update_dashboard(body))
            lines.append(f"{dash.get('title', dash['uid'])}: {base}{saved.get('url', '')}")
    except (grafana_exception, OSError) as exc:
        raise _grafana_error(exc, base, what, timeout) from exc
    except (KeyError, TypeError, AttributeError) as exc:  # an answer of an unexpected shape
        raise OperationError(f"Grafana at {base}: unexpected answer while {what}: {exc}") from exc
    return lines


# ------------------------------------------------------------------------------------- CLI


def _cmd_build(args: argparse.Namespace) -> int:
    out = Path(args.out)
    for path in build(out):
        print(f"wrote {path}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    stale = stale_files(directory)
    for rel in stale:
        print(
            f"maze-infra: {directory / rel} is missing or differs from the generator; "
            "run maze-infra dashboards build",
            file=sys.stderr,
        )
    if not stale:
        print(f"{directory}: {len(generated_files())} files match the generator")
    return 1 if stale else 0


def _cmd_push(args: argparse.Namespace) -> int:
    url = os.environ.get("GRAFANA_URL", "").strip()
    token = os.environ.get("GRAFANA_TOKEN", "").strip()
    if not url:
        raise SpecError(
            "set GRAFANA_URL to the Grafana (or Amazon Managed Grafana workspace) URL",
            field="GRAFANA_URL",
        )
    if not token:
        raise CredentialsError(
            "GRAFANA_TOKEN is not set: use a Grafana service-account token (Editor role)"
        )
    for line in push(
        Path(args.dir), url=url, token=token, folder=args.folder, timeout=args.timeout
    ):
        print(f"pushed {line}")
    return 0


def register(groups: Any) -> None:
    """Add ``dashboards build|check|push`` to ``maze-infra``."""
    group = groups.add_parser(
        "dashboards",
        help="Grafana dashboards as code",
        description="Generate the mazerl Grafana dashboards (training, serving, cluster) and "
        "their provisioning files, check the committed JSON, push them to Grafana.",
    )
    sub = group.add_subparsers(
        dest="dashboards_command", required=True, metavar="{build,check,push}"
    )
    b = sub.add_parser(
        "build",
        help="write the dashboards and provisioning files",
        description="Write the dashboards JSON and Grafana provisioning YAML.",
    )
    b.add_argument("--out", default=str(DEFAULT_DIR), help="output directory (default %(default)s)")
    b.set_defaults(command=_cmd_build)
    c = sub.add_parser(
        "check",
        help="fail if the committed files differ from the generator",
        description="Regenerate in memory and compare; exit 1 naming each file that differs.",
    )
    c.add_argument("--dir", default=str(DEFAULT_DIR), help="directory (default %(default)s)")
    c.set_defaults(command=_cmd_check)
    p = sub.add_parser(
        "push",
        help="upload the dashboards to Grafana",
        description="Upload the dashboards through Grafana's HTTP API (overwriting), into a "
        "folder created if missing. Reads GRAFANA_URL and GRAFANA_TOKEN (a service-account "
        "token; for Amazon Managed Grafana, one of the workspace's).",
    )
    p.add_argument("--dir", default=str(DEFAULT_DIR), help="directory (default %(default)s)")
    p.add_argument(
        "--folder", default=DEFAULT_FOLDER, help="Grafana folder title (default %(default)s)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=PUSH_TIMEOUT_S,
        help="seconds per HTTP request (default %(default)s)",
    )
    p.set_defaults(command=_cmd_push)
