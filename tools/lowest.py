"""Run one package's own tests with the lowest dependency versions its ranges allow.

    uv run python tools/lowest.py PACKAGE [--keep DIR]

A fresh venv gets the package's wheel, its declared dependencies (every extra included: the
package's tests exercise them) resolved with ``--resolution lowest-direct``, and its ``test``
dependency group pinned to the versions in ``uv.lock`` (the tools are not what is under test).
Workspace siblings come as wheels built from the workspace, each named by file so that no
registry package of the same name can stand in for it; their own dependencies resolve as a
user's installer would. Then ``python -m pytest <package>/tests`` runs in that venv.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

sys.path.insert(0, str(Path(__file__).resolve().parent))
from release import ROOT, Member, ReleaseError, build_wheels, clean_env, members, run


@dataclass(frozen=True)
class Plan:
    """What one lowest-versions run installs: requirement lines and the wheels they name."""

    requirements: list[str]
    wheel: Path


def locked_versions(root: Path = ROOT) -> dict[str, str]:
    """Package name -> version, from ``uv.lock``."""
    lock = tomllib.loads((root / "uv.lock").read_text())
    return {
        canonicalize_name(p["name"]): str(p["version"]) for p in lock["package"] if "version" in p
    }


def plan(m: Member, wheels: dict[str, Path], locked: dict[str, str]) -> Plan:
    """The requirement lines for ``m``'s lowest-versions run.

    Raises:
        ReleaseError: A sibling's wheel falls outside the range ``m`` asks for.
    """
    project = m.pyproject["project"]
    declared = [Requirement(r) for r in project.get("dependencies", [])]
    for extra in project.get("optional-dependencies", {}).values():
        declared += [Requirement(r) for r in extra]
    lines: list[str] = []
    siblings: dict[str, set[str]] = {}
    own = canonicalize_name(m.name)
    for req in declared:
        name = canonicalize_name(req.name)
        if name == own:
            continue
        if name in wheels:
            siblings.setdefault(name, set()).update(req.extras)
            version = _wheel_version(wheels[name])
            if not req.specifier.contains(version, prereleases=True):
                raise ReleaseError(f"{m.name}: needs {req}, but the workspace has {name} {version}")
            continue
        lines.append(str(req))
    # Siblings' own sibling dependencies must come from the workspace too.
    pending = list(siblings)
    while pending:
        name = pending.pop()
        sibling = next(s for s in members() if canonicalize_name(s.name) == name)
        for raw in sibling.pyproject["project"].get("dependencies", []):
            req = Requirement(raw)
            dep = canonicalize_name(req.name)
            if dep in wheels and dep != own:
                if dep not in siblings:
                    pending.append(dep)
                siblings.setdefault(dep, set()).update(req.extras)
    for name, extras in sorted(siblings.items()):
        suffix = f"[{','.join(sorted(extras))}]" if extras else ""
        lines.append(f"{name}{suffix} @ {wheels[name].resolve().as_uri()}")
    for raw in m.pyproject.get("dependency-groups", {}).get("test", []):
        req = Requirement(raw)
        name = canonicalize_name(req.name)
        if name not in locked:
            raise ReleaseError(f"{m.name}: test tool {req.name} is not in uv.lock")
        suffix = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        lines.append(f"{req.name}{suffix}=={locked[name]}")
    return Plan(lines, wheels[own])


def _wheel_version(wheel: Path) -> str:
    match = re.match(r"[^-]+-([^-]+)-", wheel.name)
    if match is None:
        raise ReleaseError(f"{wheel}: not a wheel file name")
    return str(Version(match[1]))


def install(p: Plan, venv: Path) -> str:
    """Create ``venv`` with ``p`` installed; return ``uv pip freeze`` of it."""
    env = clean_env()
    run(["uv", "venv", "--quiet", "--python", "3.12", str(venv)], env=env)
    python = str(venv / "bin" / "python")
    reqs = venv / "lowest-requirements.txt"
    reqs.write_text("\n".join(p.requirements) + "\n")
    pip = ["uv", "pip", "install", "--quiet", "--python", python]
    run([*pip, "--resolution", "lowest-direct", "-r", str(reqs)], env=env)
    run([*pip, "--no-deps", str(p.wheel)], env=env)
    run(["uv", "pip", "check", "--python", python], env=env)
    return run(["uv", "pip", "freeze", "--python", python], env=env)


def run_tests(
    m: Member, venv: Path, extra_args: list[str] | None = None, *, stream: bool = False
) -> str:
    """``python -m pytest <member>/tests`` inside ``venv``; return its output.

    With ``stream`` the output goes to this process's stdout as it comes (nothing is returned).

    Raises:
        ReleaseError: The tests failed.
    """
    python = str(venv / "bin" / "python")
    tests = str((m.path / "tests").relative_to(ROOT))
    cmd = [python, "-m", "pytest", tests, "-q", "-p", "no:cacheprovider", *(extra_args or [])]
    if not stream:
        return run(cmd, env=clean_env(venv), timeout=1800)
    if subprocess.run(cmd, cwd=ROOT, env=clean_env(venv), check=False).returncode:
        raise ReleaseError(f"{m.name}: its tests failed at the lowest versions")
    return ""


def main(argv: list[str] | None = None) -> int:
    """Entry point: exit 1 if the install or the tests fail."""
    parser = argparse.ArgumentParser(description="a package's tests at its lowest allowed versions")
    parser.add_argument("package")
    parser.add_argument("--keep", type=Path, default=None, help="build the venv here and keep it")
    parser.add_argument(
        "--with",
        dest="extra",
        action="append",
        default=[],
        help="an extra requirement line, e.g. 'torch==2.7.0' to try a floor (repeatable)",
    )
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args(argv)
    try:
        m = next((x for x in members() if x.name == args.package), None)
        if m is None:
            raise ReleaseError(f"no workspace package named {args.package!r}")
        with tempfile.TemporaryDirectory() as tmp:
            wheels = build_wheels(Path(tmp) / "wheels")
            p = plan(m, wheels, locked_versions())
            p = Plan([*p.requirements, *args.extra], p.wheel)
            venv = args.keep or Path(tmp) / "venv"
            print("\n".join(p.requirements))
            print(install(p, venv))
            sys.stdout.flush()
            run_tests(m, venv, args.pytest_args, stream=True)
    except ReleaseError as exc:
        print(f"lowest: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
