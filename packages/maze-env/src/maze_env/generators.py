"""Perfect-maze generators on a lattice of cells.

All generators carve an *interior* grid of odd size ``(h, w)`` whose cells sit at even
coordinates; odd coordinates between two cells are the walls that may be cut. The returned
array is ``True`` where the interior is open. The caller adds the outer wall.

``wilson`` reproduces VisGym's ``WilsonMazeGenerator`` draw for draw (same ``random.Random``
calls in the same order over the same cell ordering), so a seed gives the same maze as
``maze_2d/easy`` and ``maze_2d/hard``. The others exist for curricula and make no such promise.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Literal

import numpy as np
import numpy.typing as npt

GeneratorName = Literal["wilson", "dfs", "prim", "kruskal"]
GENERATORS: tuple[GeneratorName, ...] = ("wilson", "dfs", "prim", "kruskal")

Cell = tuple[int, int]
# VisGym's direction order for the walk; the order matters for seed parity.
_WALK: tuple[Cell, ...] = ((0, 1), (1, 0), (0, -1), (-1, 0))


def _cells(h: int, w: int) -> list[Cell]:
    # Row-major, as VisGym enumerates them; index picks into this list must match.
    return [(r, c) for r in range(0, h, 2) for c in range(0, w, 2)]


def _neighbours(cell: Cell, h: int, w: int) -> list[Cell]:
    r, c = cell
    out: list[Cell] = []
    for dr, dc in _WALK:
        nr, nc = r + 2 * dr, c + 2 * dc
        if 0 <= nr < h and 0 <= nc < w:
            out.append((nr, nc))
    return out


@functools.cache
def _wilson_tables(ch: int, cw: int) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """Per lattice size: the walk's step table and each cell's flat index in the interior grid.

    ``step[i][b]`` is the cell reached from cell ``i`` when the 3-bit draw is ``b``: a
    neighbour for b in 0..3 (VisGym's direction order), -1 for b >= 4 (randint's rejection) or
    off the lattice (VisGym's redraw), so one lookup replays both rejections. Cached: building
    it per maze cost a third of the carve.
    """
    step = tuple(
        (
            *(
                (i // cw + dr) * cw + i % cw + dc
                if 0 <= i // cw + dr < ch and 0 <= i % cw + dc < cw
                else -1
                for dr, dc in _WALK
            ),
            -1,
            -1,
            -1,
            -1,
        )
        for i in range(ch * cw)
    )
    w = 2 * cw - 1
    flat = tuple(2 * (i // cw) * w + 2 * (i % cw) for i in range(ch * cw))
    return step, flat


def wilson(h: int, w: int, rng: random.Random) -> npt.NDArray[np.bool_]:
    """Wilson's loop-erased random walk (uniform spanning tree), VisGym-compatible."""
    # Draws replicate ``rng.randint(0, n - 1)`` exactly: CPython implements it as
    # ``getrandbits(n.bit_length())`` with rejection. Calling getrandbits directly skips three
    # Python frames per draw; tests/test_visgym_parity.py pins the equivalence.
    getrandbits = rng.getrandbits

    def below(n: int) -> int:
        k = n.bit_length()
        r = getrandbits(k)
        while r >= n:
            r = getrandbits(k)
        return r

    # Cells are numbered row-major over the lattice, VisGym's enumeration order, so index picks
    # into ``unvisited`` match.
    ch, cw = (h + 1) // 2, (w + 1) // 2
    n = ch * cw
    step, flat = _wilson_tables(ch, cw)
    visited = bytearray(n)
    path = [
        0
    ] * n  # next cell on the current walk, per cell; overwritten on revisits (loop erasure)
    unvisited = list(range(n))
    # The open squares, flat over the interior grid: every cell, plus the wall square between
    # two cells joined by the tree (at the mean of their coordinates, i.e. the mean flat index).
    grid = bytearray(h * w)
    for i in flat:
        grid[i] = 1
    first_cell = unvisited.pop(below(n))
    visited[first_cell] = 1
    while unvisited:
        start = unvisited[below(len(unvisited))]
        current = start
        while not visited[current]:
            row = step[current]
            nxt = row[getrandbits(3)]
            while nxt < 0:
                nxt = row[getrandbits(3)]
            path[current] = nxt
            current = nxt
        current = start
        while not visited[current]:
            visited[current] = 1
            unvisited.remove(current)
            nxt = path[current]
            grid[(flat[current] + flat[nxt]) >> 1] = 1
            current = nxt
    return np.frombuffer(grid, dtype=np.bool_).reshape(h, w)


def dfs(h: int, w: int, rng: random.Random) -> npt.NDArray[np.bool_]:
    """Recursive backtracker (iterative): long corridors, few branches."""
    grid = np.zeros((h, w), dtype=np.bool_)
    cells = _cells(h, w)
    start = cells[rng.randrange(len(cells))]
    grid[start] = True
    stack = [start]
    while stack:
        cur = stack[-1]
        options = [n for n in _neighbours(cur, h, w) if not grid[n]]
        if not options:
            stack.pop()
            continue
        nxt = options[rng.randrange(len(options))]
        grid[(cur[0] + nxt[0]) // 2, (cur[1] + nxt[1]) // 2] = True
        grid[nxt] = True
        stack.append(nxt)
    return grid


def prim(h: int, w: int, rng: random.Random) -> npt.NDArray[np.bool_]:
    """Randomised Prim: many short dead ends."""
    grid = np.zeros((h, w), dtype=np.bool_)
    cells = _cells(h, w)
    start = cells[rng.randrange(len(cells))]
    grid[start] = True
    frontier = [(start, n) for n in _neighbours(start, h, w)]
    while frontier:
        i = rng.randrange(len(frontier))
        frontier[i], frontier[-1] = frontier[-1], frontier[i]
        src, dst = frontier.pop()
        if grid[dst]:
            continue
        grid[(src[0] + dst[0]) // 2, (src[1] + dst[1]) // 2] = True
        grid[dst] = True
        frontier.extend((dst, n) for n in _neighbours(dst, h, w) if not grid[n])
    return grid


def kruskal(h: int, w: int, rng: random.Random) -> npt.NDArray[np.bool_]:
    """Randomised Kruskal over a shuffled edge list with union-find."""
    grid = np.zeros((h, w), dtype=np.bool_)
    cells = _cells(h, w)
    parent = {c: c for c in cells}

    def find(c: Cell) -> Cell:
        while parent[c] != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    edges = [(c, (c[0], c[1] + 2)) for c in cells if c[1] + 2 < w]
    edges += [(c, (c[0] + 2, c[1])) for c in cells if c[0] + 2 < h]
    rng.shuffle(edges)
    for c in cells:
        grid[c] = True
    for a, b in edges:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[ra] = rb
            grid[(a[0] + b[0]) // 2, (a[1] + b[1]) // 2] = True
    return grid


CARVERS: dict[GeneratorName, Callable[[int, int, random.Random], npt.NDArray[np.bool_]]] = {
    "wilson": wilson,
    "dfs": dfs,
    "prim": prim,
    "kruskal": kruskal,
}
