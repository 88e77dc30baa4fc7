"""Evaluate a VLM maze policy on maze-env's fixed eval sets, in-process or through any
OpenAI-compatible endpoint, with the prompts, images, feedback and scoring of training."""

from typing import TYPE_CHECKING

from maze_evaluation.continuous import SERIES, follow, read_series
from maze_evaluation.endpoint import EndpointBackend, chat_url
from maze_evaluation.episodes import Backend, Job, Played, Sampling, derive_seed, make_env
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
from maze_evaluation.report import write_gif, write_report
from maze_evaluation.results import ResultsWriter, read_records
from maze_evaluation.runner import DEFAULT_CELL_PX, eval_rows, evaluate, load_results
from maze_evaluation.stats import (
    OUTCOME_FIELDS,
    Summary,
    compare_lines,
    episode_differences,
    pass_at_k,
    summarize,
    wilson_interval,
)

if TYPE_CHECKING:
    from maze_evaluation.local import LocalBackend

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_CELL_PX",
    "FAILURE_KINDS",
    "OUTCOME_FIELDS",
    "SERIES",
    "Backend",
    "BackendError",
    "EndpointBackend",
    "EndpointError",
    "EvalRecord",
    "EvaluationError",
    "FailureKind",
    "Identity",
    "Job",
    "LocalBackend",
    "Played",
    "ResultsFileError",
    "ResultsWriter",
    "Sampling",
    "Summary",
    "chat_url",
    "compare_lines",
    "count_loops",
    "derive_seed",
    "episode_differences",
    "eval_rows",
    "evaluate",
    "follow",
    "load_results",
    "make_env",
    "make_record",
    "pass_at_k",
    "read_records",
    "read_series",
    "replay_path",
    "summarize",
    "wilson_interval",
    "write_gif",
    "write_report",
]


def __getattr__(name: str) -> object:
    # The in-process backend imports torch; load it only when asked for.
    if name == "LocalBackend":
        from maze_evaluation.local import LocalBackend

        return LocalBackend
    raise AttributeError(f"module 'maze_evaluation' has no attribute {name!r}")
