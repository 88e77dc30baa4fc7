"""``maze-env``: inspect, render, play and export mazes."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from maze_env.errors import MazeEnvError
from maze_env.evalsets import EVAL_SETS, EvalSetError, verify_eval_set
from maze_env.game import MazeGame
from maze_env.maze import DEFAULT_SLACK, generate
from maze_env.render import QWEN3_VL_TOKEN_PX, VISGYM_CELL_PX, Renderer, Style, render_ascii


def _maze_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--preset",
        default="easy",
        help="easy, hard, ROWSxCOLS, optionally :wilson|dfs|prim|kruskal",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="layout seed: the same seed gives the same maze"
    )
    p.add_argument(
        "--slack", type=int, default=DEFAULT_SLACK, help="extra turns beyond optimal + stop"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="maze-env", description="Inspect, render, play and export mazes."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("show", help="print a maze as JSON or ASCII")
    _maze_args(p)
    p.add_argument(
        "--format", choices=["json", "ascii"], default="ascii", help="output (default ascii)"
    )

    p = sub.add_parser("render", help="write the maze image as PNG")
    _maze_args(p)
    p.add_argument("-o", "--output", type=Path, required=True, help="where the PNG goes")
    px = p.add_mutually_exclusive_group()
    px.add_argument(
        "--cell-px", type=int, default=VISGYM_CELL_PX, help="pixels per grid square (VisGym: 25)"
    )
    px.add_argument(
        "--token-aligned",
        action="store_true",
        help=f"{QWEN3_VL_TOKEN_PX} px squares: one Qwen3-VL visual token each",
    )

    p = sub.add_parser(
        "play", help="play in the terminal (arrow keys, or words: up/down/left/right/stop, q quits)"
    )
    _maze_args(p)

    p = sub.add_parser("export", help="write SkyRL train/validation datasets")
    p.add_argument("--out", type=Path, required=True, help="directory for the datasets")
    p.add_argument(
        "--train-size", type=int, default=256, help="training mazes (default %(default)s)"
    )
    p.add_argument(
        "--train-preset",
        default="easy",
        help="maze spec of the training mazes (easy, hard, ROWSxCOLS; default easy)",
    )
    p.add_argument(
        "--eval-set",
        default="easy-64",
        choices=sorted(EVAL_SETS),
        help="fixed eval set for the validation split (default %(default)s)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="write each training maze N times in a row (GRPO groups)",
    )
    p.add_argument(
        "--slack",
        type=int,
        default=DEFAULT_SLACK,
        help="extra turns beyond optimal + stop (default %(default)s)",
    )
    p.add_argument(
        "--cell-px",
        type=int,
        default=VISGYM_CELL_PX,
        help="pixels per grid square in the images (default %(default)s, as VisGym)",
    )
    p.add_argument(
        "--format",
        choices=["parquet", "jsonl"],
        default="parquet",
        help="file format (default parquet)",
    )

    p = sub.add_parser("evalsets", help="list the fixed eval sets and verify their pinned hashes")

    p = sub.add_parser(
        "demo", help="play easy-64 with an oracle and a random policy; write images and datasets"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("out/demo"),
        help="directory for the images and datasets (default %(default)s)",
    )
    p.add_argument(
        "--eval-set",
        default="easy-64",
        choices=sorted(EVAL_SETS),
        help="fixed eval set to play (default %(default)s)",
    )
    return parser


def _show(args: argparse.Namespace, out: TextIO) -> None:
    maze = generate(args.preset, args.seed)
    if args.format == "json":
        out.write(json.dumps(maze.to_dict(args.slack)) + "\n")
    else:
        out.write(render_ascii(maze) + "\n")
        out.write(
            f"optimal_moves={maze.optimal_moves} step_budget={maze.step_budget(args.slack)}\n"
        )


def _render(args: argparse.Namespace, out: TextIO) -> None:
    maze = generate(args.preset, args.seed)
    style = Style(cell_px=QWEN3_VL_TOKEN_PX if args.token_aligned else args.cell_px)
    png = Renderer(maze, style).png()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_bytes(png)
    out.write(f"wrote {args.output} ({len(png)} bytes)\n")


_KEYS = {"\x1b[A": "up", "\x1b[B": "down", "\x1b[C": "right", "\x1b[D": "left"}


def _read_key_raw() -> str:
    import termios
    import tty

    fd = sys.stdin.fileno()
    old = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        ch = os.read(fd, 1).decode(errors="replace")
        if ch == "\x1b":
            ch += os.read(fd, 2).decode(errors="replace")
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)
    return _KEYS.get(
        ch, {"s": "stop", " ": "stop", "\r": "stop", "q": "q", "\x03": "q"}.get(ch, ch)
    )


def _play(args: argparse.Namespace, out: TextIO) -> int:
    game = MazeGame.start(generate(args.preset, args.seed), slack=args.slack)
    interactive = sys.stdin.isatty()
    out.write("Arrow keys move, s/space/enter stops, q quits.\n" if interactive else "")
    while not game.done:
        out.write(f"\n{render_ascii(game.maze, game.agent)}\nturns left: {game.steps_left}\n")
        out.flush()
        if interactive:
            word = _read_key_raw()
        else:
            line = sys.stdin.readline()
            if not line:
                out.write("input ended\n")
                return 1
            word = line.strip()
        if word in ("q", "quit"):
            return 1
        result = game.step(word)
        out.write(result.feedback + "\n")
    out.write("solved!\n" if game.solved else "not solved.\n")
    out.write(f"moves: {len(game.trajectory) - 1}, optimal: {game.maze.optimal_moves}\n")
    return 0 if game.solved else 1


def _export(args: argparse.Namespace, out: TextIO) -> None:
    from maze_env.export import export_datasets

    paths = export_datasets(
        args.out,
        train_size=args.train_size,
        train_spec=args.train_preset,
        eval_set=args.eval_set,
        repeat=args.repeat,
        slack=args.slack,
        style=Style(cell_px=args.cell_px),
        fmt=args.format,
    )
    for split, path in paths.items():
        out.write(f"{split}: {path}\n")


def _evalsets(out: TextIO) -> int:
    bad = 0
    for name, es in EVAL_SETS.items():
        try:
            verify_eval_set(name)
            status = "ok"
        except EvalSetError:
            bad += 1
            status = f"CHANGED (now {es.computed_hash()})"
        moves = sorted({m.optimal_moves for m in es.mazes})
        out.write(
            f"{name}: {es.spec.name}, {len(es.seeds)} mazes, optimal moves {moves}, sha256 {es.sha256[:16]}… {status}\n"
        )
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None, stdout: TextIO | None = None) -> int:
    """Run ``maze-env``; returns the exit code (2 after printing an error)."""
    out = stdout or sys.stdout
    args = _parser().parse_args(argv)
    try:
        if args.command == "show":
            _show(args, out)
        elif args.command == "render":
            _render(args, out)
        elif args.command == "play":
            return _play(args, out)
        elif args.command == "export":
            _export(args, out)
        elif args.command == "evalsets":
            return _evalsets(out)
        elif args.command == "demo":
            from maze_env.demo import run_demo

            run_demo(args.out, out, eval_set=args.eval_set)
    except (MazeEnvError, ValueError, OSError, RuntimeError) as exc:
        sys.stderr.write(f"maze-env: error: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
