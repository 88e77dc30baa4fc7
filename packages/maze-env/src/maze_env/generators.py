"""Perfect-maze generators on a lattice of cells.

All generators carve an *interior* grid of odd size ``(h, w)`` whose cells sit at even
coordinates; odd coordinates between two cells are the walls that may be cut. The returned
array is ``True`` where the interior is open. The caller adds the outer wall.

``wilson`` reproduces VisGym's ``WilsonMazeGenerator`` draw for draw (same ``random.Random``
calls in the same order over the same cell ordering), so a seed gives the same maze as
``maze_2d/easy`` and ``maze_2d/hard``. The others exist for curricula and make no such promise.
"""

from __future__ import annotations

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
    # into ``unvisited`` match. ``nbr[i][d]`` is the cell two squares away, or -1 off the lattice.
    ch, cw = (h + 1) // 2, (w + 1) // 2
    n = ch * cw
    nbr = [
        [
            ((i // cw) + dr) * cw + (i % cw) + dc
            if 0 <= (i // cw) + dr < ch and 0 <= (i % cw) + dc < cw
            else -1
            for dr, dc in _WALK
        ]
        for i in range(n)
    ]
    visited = bytearray(n)
    path = [0] * n
    unvisited = list(range(n))
    open_cells: list[int] = []  # cut cells
    open_edges: list[tuple[int, int]] = []  # cut walls between (cell, direction)
    first_cell = unvisited.pop(below(n))
    visited[first_cell] = 1
    open_cells.append(first_cell)
    while unvisited:
        start = unvisited[below(len(unvisited))]
        current = start
        while True:
            ok = nbr[current]
            d = getrandbits(3)
            while d >= 4 or ok[d] < 0:
                d = getrandbits(3)
            # Overwriting the direction on revisits is what erases loops.
            path[current] = d
            current = ok[d]
            if visited[current]:
                break
        current = start
        while not visited[current]:
            visited[current] = 1
            unvisited.remove(current)
            open_cells.append(current)
            open_edges.append((current, path[current]))
            current = nbr[current][path[current]]
    grid = np.zeros((h, w), dtype=np.bool_)
    for i in open_cells:
        grid[2 * (i // cw), 2 * (i % cw)] = True
    for i, d in open_edges:
        grid[2 * (i // cw) + _WALK[d][0], 2 * (i % cw) + _WALK[d][1]] = True
    return grid


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
