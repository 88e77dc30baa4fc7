import pytest

from maze_env import generators
from maze_env.evalsets import EVAL_SETS, EvalSetError, get_eval_set, verify_eval_set


@pytest.mark.parametrize("name", sorted(EVAL_SETS))
def test_pinned_hashes_hold(name: str) -> None:
    es = verify_eval_set(name)
    assert len(es.mazes) == 64
    assert es.computed_hash() == es.sha256


def test_easy64_is_seeds_0_to_63_of_easy() -> None:
    es = get_eval_set("easy-64")
    assert es.seeds == tuple(range(64)) and es.spec.name == "easy"


def test_a_changed_generator_fails_verification(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(generators.CARVERS, "wilson", generators.dfs)
    get_eval_set("easy-64").__dict__.pop("mazes", None)  # drop the cached mazes
    try:
        with pytest.raises(EvalSetError, match="changed"):
            verify_eval_set("easy-64")
    finally:
        get_eval_set("easy-64").__dict__.pop("mazes", None)


def test_unknown_set() -> None:
    with pytest.raises(EvalSetError, match="known: easy-64"):
        get_eval_set("easy-65")
