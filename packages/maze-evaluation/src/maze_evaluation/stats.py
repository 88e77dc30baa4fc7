"""Summary statistics: Wilson intervals, unbiased pass@k, failure kinds, run comparison."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from maze_evaluation.records import FAILURE_KINDS, EvalRecord


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval (95% by default); (0, 1) when there is no data."""
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct (Chen et al., 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass(frozen=True, slots=True)
class Summary:
    """One run's figures: solve rate with its 95% CI, pass@k, moves vs optimal, failure counts."""

    eval_set: str
    mazes: int
    episodes: int
    samples: int
    """Samples per maze (the smallest count over mazes)."""
    solved: int
    solve_rate: float
    ci95: tuple[float, float]
    pass_at: dict[str, float]
    mean_moves: float
    mean_optimal_moves: float
    mean_moves_solved: float | None
    mean_optimal_solved: float | None
    failures: dict[str, int]
    bumps: int
    loops: int
    parse_failures: int
    episodes_with_bumps: int
    episodes_with_loops: int
    episodes_with_parse_failures: int
    by_optimal_length: dict[str, tuple[int, int]]
    """Optimal path length -> (solved, episodes)."""
    model: str
    adapter: str | None
    version: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        lo, hi = self.ci95
        out = [
            f"eval set {self.eval_set}: {self.mazes} mazes, {self.episodes} episodes "
            f"(model {self.model}{'' if self.adapter is None else ' + ' + self.adapter})",
            f"solve rate {self.solve_rate:.2%} ({self.solved}/{self.episodes}), 95% CI [{lo:.2%}, {hi:.2%}]",
        ]
        if self.samples > 1:
            out.append("pass@k: " + ", ".join(f"@{k} {v:.2%}" for k, v in self.pass_at.items()))
        moves = f"mean moves {self.mean_moves:.2f} vs optimal {self.mean_optimal_moves:.2f}"
        if self.mean_moves_solved is not None and self.mean_optimal_solved is not None:
            moves += f" (solved: {self.mean_moves_solved:.2f} vs {self.mean_optimal_solved:.2f})"
        out.append(moves)
        out.append("outcomes: " + ", ".join(f"{k} {v}" for k, v in self.failures.items()))
        out.append(
            f"wall bumps {self.bumps} in {self.episodes_with_bumps} episodes, loops {self.loops} in "
            f"{self.episodes_with_loops}, parse failures {self.parse_failures} in "
            f"{self.episodes_with_parse_failures}"
        )
        return out


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(records: Sequence[EvalRecord]) -> Summary:
    """The :class:`Summary` of one run's records.

    Raises:
        ValueError: ``records`` is empty.
    """
    if not records:
        raise ValueError("no records to summarize")
    per_maze: dict[int, list[bool]] = defaultdict(list)
    for r in records:
        per_maze[r.seed].append(r.solved)
    samples = min(len(v) for v in per_maze.values())
    pass_at: dict[str, float] = {}
    for k in sorted({1, samples}):
        vals = [pass_at_k(len(v), sum(v), k) for v in per_maze.values()]
        pass_at[str(k)] = sum(vals) / len(vals)
    solved = sum(r.solved for r in records)
    kinds = Counter(r.failure for r in records)
    by_len: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for r in records:
        by_len[r.optimal_moves][0] += r.solved
        by_len[r.optimal_moves][1] += 1
    solved_recs = [r for r in records if r.solved]
    first = records[0]
    return Summary(
        eval_set=first.eval_set,
        mazes=len(per_maze),
        episodes=len(records),
        samples=samples,
        solved=solved,
        solve_rate=solved / len(records),
        ci95=wilson_interval(solved, len(records)),
        pass_at=pass_at,
        mean_moves=sum(r.moves for r in records) / len(records),
        mean_optimal_moves=sum(r.optimal_moves for r in records) / len(records),
        mean_moves_solved=_mean([r.moves for r in solved_recs]),
        mean_optimal_solved=_mean([r.optimal_moves for r in solved_recs]),
        failures={k: kinds.get(k, 0) for k in FAILURE_KINDS},
        bumps=sum(r.bumps for r in records),
        loops=sum(r.loops for r in records),
        parse_failures=sum(r.parse_failures for r in records),
        episodes_with_bumps=sum(r.bumps > 0 for r in records),
        episodes_with_loops=sum(r.loops > 0 for r in records),
        episodes_with_parse_failures=sum(r.parse_failures > 0 for r in records),
        by_optimal_length={str(k): (v[0], v[1]) for k, v in sorted(by_len.items())},
        model=first.model,
        adapter=first.adapter,
        version=first.version,
    )


def compare_lines(
    a: Sequence[EvalRecord], b: Sequence[EvalRecord], names: tuple[str, str] = ("A", "B")
) -> list[str]:
    """Two runs side by side, then every (seed, sample) whose outcome differs."""
    sa, sb = summarize(a), summarize(b)
    la, lb = names
    width = max(len(la), len(lb), 8)

    def row(label: str, va: str, vb: str) -> str:
        return f"{label:<22} {va:>{width + 8}} {vb:>{width + 8}}"

    out = [row("", la, lb)]
    out.append(row("episodes", str(sa.episodes), str(sb.episodes)))
    out.append(row("solve rate", f"{sa.solve_rate:.2%}", f"{sb.solve_rate:.2%}"))
    out.append(
        row("95% CI", f"{sa.ci95[0]:.0%}-{sa.ci95[1]:.0%}", f"{sb.ci95[0]:.0%}-{sb.ci95[1]:.0%}")
    )
    out.append(row("mean moves", f"{sa.mean_moves:.2f}", f"{sb.mean_moves:.2f}"))
    out.append(row("mean optimal", f"{sa.mean_optimal_moves:.2f}", f"{sb.mean_optimal_moves:.2f}"))
    for kind in FAILURE_KINDS:
        out.append(row(kind, str(sa.failures[kind]), str(sb.failures[kind])))
    out.append(row("wall bumps", str(sa.bumps), str(sb.bumps)))
    out.append(row("loops", str(sa.loops), str(sb.loops)))
    out.append(row("parse failures", str(sa.parse_failures), str(sb.parse_failures)))
    ma = {r.key: r for r in a}
    mb = {r.key: r for r in b}
    diffs: list[str] = []
    for key in sorted(ma.keys() | mb.keys()):
        ra, rb = ma.get(key), mb.get(key)
        da = "-" if ra is None else f"{ra.failure}/{ra.moves}m"
        db = "-" if rb is None else f"{rb.failure}/{rb.moves}m"
        if ra is None or rb is None or ra.solved != rb.solved or ra.failure != rb.failure:
            diffs.append(f"  seed {key[0]:>5} sample {key[1]}: {da:<22} -> {db}")
    only_a = sum(1 for k in ma if k in mb and ma[k].solved and not mb[k].solved)
    only_b = sum(1 for k in mb if k in ma and mb[k].solved and not ma[k].solved)
    out.append(
        f"per-maze differences: {len(diffs)} (solved only in {la}: {only_a}, only in {lb}: {only_b})"
    )
    out.extend(diffs)
    return out


OUTCOME_FIELDS = ("solved", "reward", "failure", "turns", "moves", "path", "replies")


def episode_differences(
    a: Sequence[EvalRecord], b: Sequence[EvalRecord], fields: Sequence[str] = OUTCOME_FIELDS
) -> list[tuple[tuple[int, int], str]]:
    """``(seed, sample)`` and field for every episode whose outcome differs between two runs.

    The field is ``"missing"`` where only one run has the episode. Use it to compare e.g. an
    endpoint run with an in-process one.
    """
    ma = {r.key: asdict(r) for r in a}
    mb = {r.key: asdict(r) for r in b}
    out: list[tuple[tuple[int, int], str]] = []
    for key in sorted(ma.keys() | mb.keys()):
        if key not in ma or key not in mb:
            out.append((key, "missing"))
            continue
        out.extend((key, f) for f in fields if ma[key][f] != mb[key][f])
    return out
