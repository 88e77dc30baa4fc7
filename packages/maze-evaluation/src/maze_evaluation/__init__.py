"""Evaluate a VLM maze policy on maze-env's fixed eval sets.

Runs in-process or through any OpenAI-compatible endpoint, with the prompts, images, feedback
and scoring of training.

Only light names are exported here; the in-process backend imports torch, so it is imported by
path: ``from maze_evaluation.local import LocalBackend``.
"""

from importlib.metadata import version as _version

from maze_evaluation.continuous import SERIES, follow, read_series
from maze_evaluation.endpoint import EndpointBackend, chat_url
from maze_evaluation.episodes import Backend, Job, Played
from maze_evaluation.errors import BackendError, EndpointError, EvaluationError, ResultsFileError
from maze_evaluation.records import (
    FAILURE_KINDS,
    EvalRecord,
    FailureKind,
    Identity,
    count_loops,
    make_record,
    replay_path,
)
from maze_evaluation.report import (
    SERIES_CHART,
    compare_figure,
    report_figure,
    series_figure,
    write_compare,
    write_gif,
    write_report,
    write_series_chart,
)
from maze_evaluation.results import ResultsWriter, read_records
from maze_evaluation.runner import (
    DEFAULT_CELL_PX,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_TEMPERATURE,
    eval_rows,
    evaluate,
    load_results,
    sampling_params,
)
from maze_evaluation.stats import (
    OUTCOME_FIELDS,
    Summary,
    compare_lines,
    episode_differences,
    pass_at_k,
    summarize,
    wilson_interval,
)

__version__ = _version("maze-evaluation")  # one source: the pyproject's version

__all__ = [
    "DEFAULT_CELL_PX",
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_TEMPERATURE",
    "FAILURE_KINDS",
    "OUTCOME_FIELDS",
    "SERIES",
    "SERIES_CHART",
    "Backend",
    "BackendError",
    "EndpointBackend",
    "EndpointError",
    "EvalRecord",
    "EvaluationError",
    "FailureKind",
    "Identity",
    "Job",
    "Played",
    "ResultsFileError",
    "ResultsWriter",
    "Summary",
    "__version__",
    "chat_url",
    "compare_figure",
    "compare_lines",
    "count_loops",
    "episode_differences",
    "eval_rows",
    "evaluate",
    "follow",
    "load_results",
    "make_record",
    "pass_at_k",
    "read_records",
    "read_series",
    "replay_path",
    "report_figure",
    "sampling_params",
    "series_figure",
    "summarize",
    "wilson_interval",
    "write_compare",
    "write_gif",
    "write_report",
    "write_series_chart",
]
