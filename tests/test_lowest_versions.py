"""Every package's own tests pass with the lowest dependency versions its ranges allow.

A range whose floor does not hold breaks users who have that version installed; it is narrowed
in the package's pyproject instead. See tools/lowest.py for what is installed and how.
"""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import lowest  # noqa: E402
from release import Member, members  # noqa: E402

SIBLINGS = {lowest.canonicalize_name(m.name) for m in members()}


def _third_party(m: Member) -> list[str]:
    project = m.pyproject["project"]
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return [r for r in reqs if lowest.canonicalize_name(lowest.Requirement(r).name) not in SIBLINGS]


# A member whose ranges name only workspace siblings (the apps) resolves at its floors exactly as
# it does locked: each sibling has one version, the workspace's. Its tests run in the main suite.
MEMBERS = [m for m in members() if _third_party(m)]


def test_only_members_without_third_party_ranges_are_left_out() -> None:
    left_out = {m.name for m in members()} - {m.name for m in MEMBERS}
    assert left_out == {"maze-trainer", "maze-server", "maze-evaluator"}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return lowest.build_wheels(tmp_path_factory.mktemp("wheels"))


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("member", MEMBERS, ids=[m.name for m in MEMBERS])
def test_own_tests_pass_at_lowest_allowed_versions(
    member: Member, wheels: dict[str, Path], tmp_path: Path
) -> None:
    plan = lowest.plan(member, wheels, lowest.locked_versions())
    freeze = lowest.install(plan, tmp_path / "venv")
    # lowest-direct engaged: direct dependencies sit at their floors, except where another
    # requirement lifts one (a sibling's newest transitive dependency, a test tool's pin).
    installed: dict[str, lowest.Version] = {
        lowest.canonicalize_name(row.split("==")[0]): lowest.Version(row.split("==")[1])
        for row in freeze.splitlines()
        if "==" in row
    }
    floors: dict[str, lowest.Version] = {}
    for line in plan.requirements:
        if " @ " in line or "==" in line:
            continue
        req = lowest.Requirement(line)
        floor = next((s.version for s in req.specifier if s.operator == ">="), None)
        if floor is not None:
            floors[lowest.canonicalize_name(req.name)] = lowest.Version(floor)
    at_floor = [name for name, floor in floors.items() if installed.get(name) == floor]
    lifted = {name: str(installed.get(name)) for name in floors if name not in at_floor}
    print(f"{member.name}: {len(at_floor)} of {len(floors)} at their floor; lifted: {lifted}")
    assert not floors or at_floor, lifted
    out = lowest.run_tests(member, tmp_path / "venv")
    assert " passed" in out and " failed" not in out, out[-3000:]
