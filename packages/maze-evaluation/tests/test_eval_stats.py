import itertools
import math

import pytest

from maze_evaluation import count_loops, pass_at_k, wilson_interval


def test_wilson_matches_closed_forms() -> None:
    z = 1.959964
    # 0 of n: lower bound 0, upper bound z^2 / (n + z^2).
    lo, hi = wilson_interval(0, 64)
    assert lo == 0.0 and hi == pytest.approx(z * z / (64 + z * z))
    # n of n mirrors it.
    lo, hi = wilson_interval(64, 64)
    assert hi == 1.0 and lo == pytest.approx(64 / (64 + z * z))
    # Symmetric around p = 1/2 and contains the point estimate.
    lo, hi = wilson_interval(32, 64)
    assert lo + hi == pytest.approx(1.0) and lo < 0.5 < hi
    assert wilson_interval(0, 0) == (0.0, 1.0)


@pytest.mark.parametrize(
    ("n", "c", "k"), [(5, 0, 1), (5, 2, 1), (5, 2, 3), (6, 3, 6), (4, 4, 2), (7, 1, 4)]
)
def test_pass_at_k_equals_subset_enumeration(n: int, c: int, k: int) -> None:
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    expected = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
    assert math.isclose(pass_at_k(n, c, k), expected)


def test_pass_at_k_rejects_bad_counts() -> None:
    with pytest.raises(ValueError, match="pass@k"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="pass@k"):
        pass_at_k(3, 1, 4)


def test_count_loops_counts_revisits() -> None:
    assert count_loops([(1, 1), (1, 2), (1, 3)]) == 0
    assert count_loops([(1, 1), (1, 2), (1, 1), (1, 2), (1, 1)]) == 3
