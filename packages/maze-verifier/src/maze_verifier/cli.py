"""``maze-verifier`` command line: score episodes from JSONL, list reward specs.

Input lines name a maze and hold either the replies of a multi-turn episode or one whole-path
answer::

    {"preset": "easy", "seed": 3, "turns": ["<action>right</action>", "..."]}
    {"preset": "13x13:dfs", "seed": 7, "answer": "<answer>RRDD</answer>", "step_budget": 40}

Each output line is the input's ``id`` (or line number) with its :class:`EpisodeScore`, or an
``error`` naming the line; bad lines never stop the run, and the exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO, cast

from maze_env import MazeSpecError, generate
from maze_verifier.errors import MazeVerifierError
from maze_verifier.score import score_episode, score_path
from maze_verifier.specs import SPECS, RewardSpecError, get_spec

DESCRIPTION = "Score maze episodes from JSONL and list reward specs."


class InputError(MazeVerifierError, ValueError):
    """A JSONL line that cannot be scored."""


def _score_line(record: object, spec: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise InputError("line must be a JSON object")
    rec: dict[str, Any] = record  # pyright: ignore[reportUnknownVariableType]
    preset, seed = rec.get("preset", "easy"), rec.get("seed")
    if not isinstance(preset, str):
        raise InputError(f"'preset' must be a string, got {preset!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError(f"'seed' must be a non-negative int, got {seed!r}")
    budget = rec.get("step_budget")
    if budget is not None and (
        isinstance(budget, bool) or not isinstance(budget, int) or budget < 1
    ):
        raise InputError(f"'step_budget' must be a positive int, got {budget!r}")
    try:
        maze = generate(preset, seed)
    except MazeSpecError as e:
        raise InputError(f"'preset'/'seed': {e}") from e
    line_spec = rec.get("spec", spec)
    try:
        rs = get_spec(line_spec)
    except RewardSpecError as e:
        raise InputError(f"'spec': {e}") from e
    if "turns" in rec:
        turns = rec["turns"]
        if not isinstance(turns, list):
            raise InputError("'turns' must be a list of replies")
        return score_episode(maze, turns, rs, step_budget=budget).to_dict()  # pyright: ignore[reportUnknownArgumentType]
    if "answer" in rec:
        return score_path(maze, rec["answer"], rs, step_budget=budget).to_dict()
    raise InputError("line needs 'turns' (multi-turn replies) or 'answer' (a whole path)")


def _lines(source: TextIO) -> Iterator[tuple[int, str]]:
    for n, line in enumerate(source, start=1):
        if line.strip():
            yield n, line


def score_stream(source: TextIO, out: TextIO, spec: str, name: str) -> int:
    """Score every line of ``source`` into ``out``; returns the number of failed lines."""
    failed = 0
    for n, line in _lines(source):
        ident: object = n
        try:
            try:
                record: object = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"not JSON: {e.msg} at column {e.colno}") from e
            if isinstance(record, dict):
                ident = cast(dict[str, Any], record).get("id", n)
            result: dict[str, Any] = {"id": ident, **_score_line(cast(object, record), spec)}
        except (InputError, RecursionError) as e:
            failed += 1
            result = {"id": ident, "error": f"{name}:{n}: {e}"}
        out.write(json.dumps(result) + "\n")
    return failed


def main(argv: list[str] | None = None) -> int:
    """Run ``maze-verifier``.

    Returns:
        The exit code: 0 when every line was scored, 1 when some were not (each gets an
        ``error``), 2 for a bad ``--spec`` or a file that cannot be opened.
    """
    ap = argparse.ArgumentParser(prog="maze-verifier", description=DESCRIPTION)
    sub = ap.add_subparsers(dest="command", required=True)
    sc = sub.add_parser("score", help="score JSONL episodes (see module docs for the line format)")
    sc.add_argument("input", nargs="?", default="-", help="JSONL file, or - for stdin")
    sc.add_argument("--spec", default="task", help=f"reward spec: {', '.join(sorted(SPECS))}")
    sc.add_argument(
        "--output", "-o", default="-", help="where to write JSONL scores (default stdout)"
    )
    sub.add_parser("specs", help="list the registered reward specs")
    args = ap.parse_args(argv)

    if args.command == "specs":
        for spec in SPECS.values():
            print(json.dumps(spec.to_dict()))
        return 0
    try:
        get_spec(args.spec)
    except RewardSpecError as e:
        print(f"maze-verifier: --spec: {e}", file=sys.stderr)
        return 2
    name = "<stdin>" if args.input == "-" else args.input
    with contextlib.ExitStack() as stack:
        try:
            source = (
                sys.stdin
                if args.input == "-"
                else stack.enter_context(Path(args.input).open(encoding="utf-8", errors="replace"))
            )
            out = (
                sys.stdout
                if args.output == "-"
                else stack.enter_context(Path(args.output).open("w", encoding="utf-8"))
            )
        except OSError as e:
            print(f"maze-verifier: cannot open {e.filename}: {e.strerror}", file=sys.stderr)
            return 2
        failed = score_stream(source, out, args.spec, name)
    if failed:
        print(
            f"maze-verifier: {failed} lines could not be scored (see their 'error')",
            file=sys.stderr,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
