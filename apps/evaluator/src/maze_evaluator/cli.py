"""maze-eval: argument parsing and wiring; the evaluation itself is maze_evaluation's.

Exit codes: 0 whatever the score; 2 for bad input (unknown eval set, bad file, bad option);
1 for a run that could not finish (endpoint down after retries, unloadable model).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SUBCOMMANDS = ("run", "compare", "summary", "report", "gif", "follow")

EXAMPLES = """\
examples:
  maze-eval --endpoint http://127.0.0.1:8000 --model base:v3 --out runs/v3.jsonl
  maze-eval --model-dir ckpt/base --adapter ckpt/adapter --eval-set small-64 --out runs/local.jsonl
  maze-eval --compare runs/base.jsonl runs/v3.jsonl --out runs/base-vs-v3.png
  maze-eval report runs/v3.jsonl --out runs/v3.png
  maze-eval gif runs/v3.jsonl --seed 7 --out runs/seed7.gif
  maze-eval follow --sync-dir /shared/lora --out-dir runs/series --endpoint http://127.0.0.1:8000 --model 'base:v{version}'
"""


class UsageError(Exception):
    """Bad command-line input: exit code 2."""


def _backend_args(p: argparse.ArgumentParser, *, follow: bool) -> None:
    g = p.add_argument_group("backend (one of)")
    g.add_argument("--model-dir", type=Path, help="in-process: a Hugging Face model directory")
    if not follow:
        g.add_argument("--adapter", type=Path, help="in-process: a PEFT adapter directory")
    g.add_argument("--endpoint", help="OpenAI-compatible server URL (http://host:port[/v1])")
    g.add_argument(
        "--model",
        help="model name sent to the endpoint"
        + (" ('{version}' is replaced by each published version)" if follow else ""),
    )
    g.add_argument("--concurrency", type=int, default=8, help="endpoint requests in flight")
    g.add_argument("--timeout", type=float, default=120.0, help="seconds per endpoint request")
    g.add_argument("--retries", type=int, default=4, help="retries on 429/5xx/connection errors")
    g.add_argument("--api-key", help="bearer token for the endpoint")
    g.add_argument("--batch-size", type=int, default=8, help="in-process episodes per batch")
    e = p.add_argument_group("episodes")
    e.add_argument("--eval-set", default="easy-64", help="easy-64 (default), small-64, hard-64")
    e.add_argument("--samples", type=int, default=1, help="samples per maze, for pass@k")
    e.add_argument(
        "--temperature",
        type=float,
        help="sampling temperature (default: greedy for 1 sample, else 1.0)",
    )
    e.add_argument(
        "--max-new-tokens", type=int, default=256, help="reply length cap in tokens (default 256)"
    )
    e.add_argument("--limit", type=int, help="only the first N mazes of the set")
    e.add_argument("--seed", type=int, default=0, help="base of the per-episode sampling seeds")
    e.add_argument(
        "--cell-px",
        type=int,
        default=None,
        help="pixels per grid square (default: as the adapter or endpoint records it, else 32)",
    )
    e.add_argument(
        "--context",
        default=None,
        help="what each turn is answered from, as the policy was trained (maze-train's "
        "local.context): full (the whole conversation), latest (the system prompt and "
        "the latest frame), recent (and the previous reply), route (the latest frame, asked "
        "the route question) or route-recent (that, after the previous reply); default: as the "
        "adapter records it, else full",
    )
    e.add_argument("--no-progress", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    """The ``maze-eval`` parser: run, compare, summary, report, gif and follow."""
    parser = argparse.ArgumentParser(
        prog="maze-eval",
        description="Evaluate a VLM on the fixed maze sets. Without a subcommand, 'run' is "
        "assumed; '--compare A B' is 'compare A B'.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="evaluate once")
    _backend_args(run, follow=False)
    run.add_argument("--out", type=Path, help="results JSONL (default maze-eval-<eval set>.jsonl)")
    run.add_argument("--resume", action="store_true", help="continue an interrupted --out file")
    run.add_argument("--report", type=Path, help="also write the PNG report here")
    run.add_argument("--summary-json", type=Path, help="also write the summary as JSON here")
    run.add_argument("--json", action="store_true", help="print the summary as JSON")

    cmp_ = sub.add_parser("compare", help="two runs side by side, with per-maze differences")
    cmp_.add_argument("a", type=Path, help="results JSONL of run A")
    cmp_.add_argument("b", type=Path, help="results JSONL of run B")
    cmp_.add_argument(
        "--out", type=Path, metavar="PNG", help="also write the side-by-side chart here"
    )

    summ = sub.add_parser("summary", help="summarize a results file")
    summ.add_argument("results", type=Path, help="results JSONL")
    summ.add_argument("--json", action="store_true", help="print the summary as JSON")

    rep = sub.add_parser("report", help="PNG: solve rate by optimal length, outcomes, failed mazes")
    rep.add_argument("results", type=Path, help="results JSONL")
    rep.add_argument("--out", type=Path, required=True, metavar="PNG", help="where the PNG goes")
    rep.add_argument(
        "--max-failed", type=int, default=16, help="failed mazes shown at most (default 16)"
    )

    gif = sub.add_parser("gif", help="animated GIF of one episode")
    gif.add_argument("results", type=Path, help="results JSONL")
    gif.add_argument("--seed", type=int, required=True, help="maze seed")
    gif.add_argument("--sample", type=int, default=0, help="which sample of that maze (default 0)")
    gif.add_argument("--out", type=Path, required=True, metavar="GIF", help="where the GIF goes")
    gif.add_argument("--cell-px", type=int, default=32, help="pixels per grid square (default 32)")

    fol = sub.add_parser(
        "follow", help="evaluate each adapter version a weight-sync store publishes"
    )
    fol.add_argument("--sync-dir", type=Path, required=True, help="weight-sync store root")
    fol.add_argument(
        "--out-dir",
        type=Path,
        required=True,
        help="per-version results, series.jsonl and its chart series.png",
    )
    fol.add_argument("--idle-timeout", type=float, help="stop after this many idle seconds")
    fol.add_argument("--max-versions", type=int, help="stop after this many versions")
    fol.add_argument(
        "--poll-interval",
        type=float,
        default=0.5,
        help="seconds between looks at the store (default 0.5)",
    )
    _backend_args(fol, follow=True)
    return parser


def _normalise(argv: list[str]) -> list[str]:
    if argv and argv[0] == "--compare":
        return ["compare", *argv[1:]]
    if argv and argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help"):
        return ["run", *argv]
    return argv


def _eval_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    from maze_policy.contexts import check_context

    for name in ("samples", "max_new_tokens", "concurrency", "batch_size"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1")
    try:
        if args.context is not None:
            check_context(args.context)
    except ValueError as exc:
        raise UsageError(f"--context: {exc}") from None
    return {
        "eval_set": args.eval_set,
        "samples": args.samples,
        "temperature": args.temperature,
        "max_new_tokens": args.max_new_tokens,
        "limit": args.limit,
        "seed": args.seed,
        "cell_px": args.cell_px,
        "progress": not args.no_progress,
    }


def _resolve_cell_px(args: argparse.Namespace, adapter_dir: Path | None, *, ask: bool) -> int:
    """The square size to render with (see ``maze_evaluation.rendering``), saying where from.

    ``ask``: look the model up in the endpoint's ``/v1/models`` (``run``; ``follow`` reads the
    store's newest version instead, whose model names are templates).
    """
    from maze_evaluation.rendering import resolve_cell_px

    cell_px, where = resolve_cell_px(
        args.cell_px,
        adapter_dir=adapter_dir,
        endpoint=args.endpoint if ask else None,
        model=args.model,
        api_key=args.api_key,
    )
    print(f"rendering: {cell_px} px per square ({where})", file=sys.stderr)
    return cell_px


def _resolve_context(args: argparse.Namespace, adapter_dir: Path | None) -> None:
    """Set ``args.context`` to the context to answer in (see ``maze_evaluation.rendering``)."""
    from maze_evaluation.rendering import resolve_context

    args.context, where, warning = resolve_context(args.context, adapter_dir=adapter_dir)
    print(f"context: {args.context} ({where})", file=sys.stderr)
    if warning is not None:
        print(warning, file=sys.stderr)


def _check_backend(args: argparse.Namespace) -> None:
    if (args.model_dir is None) == (args.endpoint is None):
        raise UsageError("give exactly one backend: --model-dir DIR or --endpoint URL --model NAME")
    if args.endpoint is not None and not args.model:
        raise UsageError("--endpoint needs --model NAME")


def _endpoint(args: argparse.Namespace, model: str, version: int | None = None) -> Any:
    from maze_evaluation import EndpointBackend

    return EndpointBackend(
        args.endpoint,
        model,
        concurrency=args.concurrency,
        timeout=args.timeout,
        retries=args.retries,
        api_key=args.api_key,
        version=version,
        context=args.context,
    )


def _run(args: argparse.Namespace) -> int:
    from maze_env import get_eval_set
    from maze_evaluation import evaluate, summarize, write_report
    from maze_evaluation.local import LocalBackend

    _check_backend(args)
    kwargs = _eval_kwargs(args)
    get_eval_set(args.eval_set)  # unknown names fail before any model loads
    kwargs["cell_px"] = _resolve_cell_px(args, args.adapter, ask=True)
    _resolve_context(args, args.adapter)
    backend = (
        _endpoint(args, args.model)
        if args.endpoint is not None
        else LocalBackend(
            args.model_dir, args.adapter, batch_size=args.batch_size, context=args.context
        )
    )
    out = args.out or Path(f"maze-eval-{args.eval_set}.jsonl")
    records = evaluate(backend, out=out, resume=args.resume, **kwargs)
    summary = summarize(records)
    if args.json:
        print(json.dumps(summary.to_dict()))
    else:
        print("\n".join(summary.lines()))
        print(f"results: {out}")
    if args.summary_json is not None:
        args.summary_json.write_text(json.dumps(summary.to_dict(), indent=1) + "\n")
    if args.report is not None:
        write_report(records, args.report)
    return 0


def _follow(args: argparse.Namespace) -> int:
    from maze_env import get_eval_set
    from maze_evaluation import SERIES_CHART, Summary, follow
    from maze_evaluation.local import LocalBackend
    from weight_sync import PublishedVersion

    _check_backend(args)
    from weight_sync import AdapterStore

    kwargs = _eval_kwargs(args)
    get_eval_set(args.eval_set)
    latest = AdapterStore(args.sync_dir).latest() if args.sync_dir.is_dir() else None
    kwargs["cell_px"] = _resolve_cell_px(args, None if latest is None else latest.path, ask=False)
    _resolve_context(args, None if latest is None else latest.path)
    local: list[Any] = []

    def backend_for(pv: PublishedVersion) -> Any:
        if args.endpoint is not None:
            model = args.model.replace("{version}", str(pv.version))
            return _endpoint(args, model, pv.version)
        if not local:
            local.append(
                LocalBackend(args.model_dir, batch_size=args.batch_size, context=args.context)
            )
        local[0].load_adapter(pv.path, pv.version)
        return local[0]

    def show(version: int, s: Summary) -> None:
        lo, hi = s.ci95
        print(
            f"v{version}: solve rate {s.solve_rate:.2%} [{lo:.2%}, {hi:.2%}] ({s.solved}/{s.episodes})",
            flush=True,
        )

    follow(
        args.sync_dir,
        args.out_dir,
        backend_for,
        idle_timeout=args.idle_timeout,
        max_versions=args.max_versions,
        poll_interval=args.poll_interval,
        on_summary=show,
        **kwargs,
    )
    chart = args.out_dir / SERIES_CHART
    if chart.is_file():
        print(f"chart: {chart}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from maze_evaluation import compare_lines, read_records, write_compare

    a, b = read_records(args.a), read_records(args.b)
    for path, recs in ((args.a, a), (args.b, b)):
        if not recs:
            raise UsageError(f"{path}: no records")
    names = (args.a.name, args.b.name)
    print("\n".join(compare_lines(a, b, names)))
    if args.out is not None:
        print(f"chart: {write_compare(a, b, args.out, names)}")
    return 0


def _dispatch(args: argparse.Namespace) -> int:
    from maze_evaluation import read_records, summarize, write_gif, write_report

    if args.command == "run":
        return _run(args)
    if args.command == "follow":
        return _follow(args)
    if args.command == "compare":
        return _compare(args)
    records = read_records(args.results)
    if not records:
        raise UsageError(f"{args.results}: no records")
    if args.command == "summary":
        s = summarize(records)
        print(json.dumps(s.to_dict()) if args.json else "\n".join(s.lines()))
    elif args.command == "report":
        print(write_report(records, args.out, max_failed=args.max_failed))
    else:
        match = [r for r in records if r.seed == args.seed and r.sample == args.sample]
        if not match:
            raise UsageError(f"{args.results}: no record for seed {args.seed} sample {args.sample}")
        print(write_gif(match[0], args.out, cell_px=args.cell_px))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``maze-eval``; a bare argument list means ``run``, ``--compare A B`` means ``compare``.

    Args:
        argv: Command-line arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 on success, 2 for bad arguments or input files, 1 when the backend or
        the evaluation fails, 130 when interrupted.
    """
    from maze_env import EvalSetError
    from maze_evaluation import BackendError, EvaluationError, ResultsFileError

    logging.basicConfig(level=logging.WARNING, format="maze-eval: %(levelname)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(_normalise(list(sys.argv[1:] if argv is None else argv)))
    try:
        return _dispatch(args)
    except (UsageError, EvalSetError, ResultsFileError, ValueError) as exc:
        print(f"maze-eval: error: {exc}", file=sys.stderr)
        return 2
    except (BackendError, EvaluationError) as exc:
        print(f"maze-eval: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "maze-eval: interrupted; finished episodes are saved, continue with --resume",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
