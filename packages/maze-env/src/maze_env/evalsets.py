"""Named, fixed evaluation sets, pinned by a content hash.

A change to the generator, the seeding or the corner choice changes the hash, so it fails
``verify_eval_set`` (and the tests) instead of silently changing a benchmark.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

from maze_env.errors import MazeEnvError
from maze_env.maze import Maze, MazeSpec, generate


class EvalSetError(MazeEnvError, ValueError):
    """Unknown eval set, or one whose mazes no longer match the pinned hash."""


@dataclass(frozen=True)
class EvalSet:
    """A named, fixed list of maze seeds for one spec, with the pinned hash of its mazes."""

    name: str
    spec: MazeSpec
    seeds: tuple[int, ...]
    sha256: str
    """Pinned hash of the mazes; see :func:`mazes_hash`."""
    description: str = ""

    @cached_property
    def mazes(self) -> tuple[Maze, ...]:
        return tuple(generate(self.spec, s) for s in self.seeds)

    def computed_hash(self) -> str:
        return mazes_hash(self.mazes)


def mazes_hash(mazes: tuple[Maze, ...] | list[Maze]) -> str:
    """sha256 over the ordered per-maze content hashes (layout, start, goal)."""
    h = hashlib.sha256()
    for m in mazes:
        h.update(m.content_hash().encode())
    return h.hexdigest()


EVAL_SETS: dict[str, EvalSet] = {
    s.name: s
    for s in (
        EvalSet(
            "easy-64",
            MazeSpec(9, 9),
            tuple(range(64)),
            "c78a71c10aa92caf01fde238be52949874a3c6ddbfedb3932241dc831ceca940",
            "VisGym maze_2d/easy seeds 0..63: the fixed 64-maze set of SkyRL's VisGym example and the "
            "reference result (43.75% -> 96.9%).",
        ),
        EvalSet(
            "small-64",
            MazeSpec(7, 7),
            tuple(range(64)),
            "9fb161082cfb9eedd31974186141b6f887687452e3a7520403e946d70bc90242",
            "7x7 (3x3 cells) Wilson seeds 0..63: the CPU-scale set the local engine's default run "
            "reports on. 60 distinct layouts (7x7 has only 768).",
        ),
        EvalSet(
            "tiny-64",
            MazeSpec(5, 5),
            tuple(range(64)),
            "cced838f445eab09daab2db4b45a50166083b4b9a43d4f0f4016a267ffe1c794",
            "5x5 (2x2 cells) seeds 0..63, 4 moves each: a smoke-scale set for laptop runs. Only 16 "
            "distinct 5x5 mazes exist, so it measures learning the task, not generalisation.",
        ),
        EvalSet(
            "hard-64",
            MazeSpec(11, 11),
            tuple(range(64)),
            "51b5c8a9e8a81dc07e5d0ae08095f0cbe0fe62c660bbc3c2e3a64d71f31db6c8",
            "VisGym maze_2d/hard seeds 0..63.",
        ),
    )
}


def get_eval_set(name: str) -> EvalSet:
    """The eval set called ``name``, unverified (see :func:`verify_eval_set`).

    Raises:
        EvalSetError: No set has that name.
    """
    try:
        return EVAL_SETS[name]
    except KeyError:
        raise EvalSetError(f"unknown eval set {name!r}; known: {', '.join(EVAL_SETS)}") from None


def verify_eval_set(name: str) -> EvalSet:
    """Return the named set after checking its mazes against the pinned hash."""
    es = get_eval_set(name)
    got = es.computed_hash()
    if got != es.sha256:
        raise EvalSetError(
            f"eval set {name!r} changed: mazes hash {got}, pinned {es.sha256}. The generator or its "
            "seeding no longer reproduces the benchmark; fix the generator, or if the change is "
            "intended, publish it as a new eval set name."
        )
    return es
