"""Each package builds alone into a wheel that installs and imports in a fresh environment.

This is what independent versioning means in practice: a team can release its package
without the rest of the workspace. Workspace siblings a package depends on are offered as
wheels too (as they would come from a package index), never as source.
"""

import os
import subprocess
import tomllib
from pathlib import Path
from typing import cast

import pytest

ROOT = Path(__file__).resolve().parents[1]
MEMBERS = sorted(p.parent for p in ROOT.glob("packages/*/pyproject.toml")) + sorted(
    p.parent for p in ROOT.glob("apps/*/pyproject.toml")
)
PYTHON_FLOOR = "3.12"
# Serving and evaluation images carry the policy, not the RL stack: no SkyRL, no Ray.
WITHOUT_RL_STACK = {
    "maze-policy",
    "maze-serving",
    "maze-evaluation",
    "maze-env",
    "maze-verifier",
    "maze-infra",  # deploys clusters and dashboards from a laptop or CI: AWS and Grafana clients only
}
RL_STACK = ("skyrl", "ray")
# Without their model extras these evaluate endpoints and build mazes: no torch either.
WITHOUT_TORCH = {"maze-policy", "maze-evaluation", "maze-env", "maze-verifier", "maze-infra"}


def _meta(member: Path) -> dict[str, object]:
    return tomllib.loads((member / "pyproject.toml").read_text())["project"]


def _run(cmd: list[str], cwd: Path = ROOT) -> str:
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
    }
    proc = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=900, check=False, env=env
    )
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _install_alone(wheel: Path, wheels: Path, venv: Path) -> str:
    """A fresh venv with ``wheel`` and what it declares (siblings from ``wheels``); its python."""
    _run(["uv", "venv", "--quiet", "--python", "3.12", str(venv)])
    python = str(venv / "bin" / "python")
    install = ["uv", "pip", "install", "--quiet", "--python", python]
    _run([*install, "--find-links", str(wheels), str(wheel)])
    return python


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    for member in MEMBERS:
        _run(
            [
                "uv",
                "build",
                "--package",
                str(_meta(member)["name"]),
                "--wheel",
                "--out-dir",
                str(out),
            ]
        )
    return out


@pytest.mark.parametrize("member", MEMBERS, ids=[m.name for m in MEMBERS])
def test_wheel_installs_and_imports_alone(member: Path, wheels: Path, tmp_path: Path) -> None:
    meta = _meta(member)
    name = str(meta["name"])
    module = name.replace("-", "_")
    built = sorted(wheels.glob(f"{module}-{meta['version']}-*.whl"))
    assert len(built) == 1, f"expected one wheel for {name}, found {built}"
    venv = tmp_path / "venv"
    python = _install_alone(built[0], wheels, venv)
    # Only this wheel and its declared dependencies are present: no workspace source on the path.
    code = f"import {module}, pathlib; p = pathlib.Path({module}.__file__); assert 'site-packages' in str(p), p; print({module}.__name__)"
    assert _run([python, "-c", code], cwd=tmp_path).strip() == module
    assert (Path(str(venv)) / "lib" / "python3.12" / "site-packages" / module / "py.typed").exists()
    scripts = cast(dict[str, str], meta.get("scripts", {}))
    for script in scripts:
        _run([str(venv / "bin" / script), "--help"], cwd=tmp_path)
    if name in WITHOUT_RL_STACK:
        probe = f"import importlib.util as u; print([m for m in {RL_STACK!r} if u.find_spec(m)])"
        assert _run([python, "-c", probe], cwd=tmp_path).strip() == "[]", (
            f"{name} pulls in the RL stack"
        )
    if name in WITHOUT_TORCH:
        probe = "import importlib.util as u; print(u.find_spec('torch') is None)"
        assert _run([python, "-c", probe], cwd=tmp_path).strip() == "True", f"{name} pulls in torch"


def test_one_python_floor_everywhere() -> None:
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert root["tool"]["pyright"]["pythonVersion"] == PYTHON_FLOOR
    assert root["tool"]["ruff"]["target-version"] == "py" + PYTHON_FLOOR.replace(".", "")
    assert (ROOT / ".python-version").read_text().strip() == PYTHON_FLOOR
    floors = {m.name: _meta(m)["requires-python"] for m in MEMBERS}
    assert floors == dict.fromkeys(floors, f">={PYTHON_FLOOR}")


# maze-env is taken into other projects: this is all it may bring (gymnasium's own deps included).
MAZE_ENV_DISTRIBUTIONS = {
    "cloudpickle",
    "farama-notifications",
    "gymnasium",
    "maze-env",
    "numpy",
    "pillow",
    "typing-extensions",
    "weight-sync",
}


def test_maze_env_alone_runs_its_readme_example(wheels: Path, tmp_path: Path) -> None:
    python = _install_alone(sorted(wheels.glob("maze_env-*.whl"))[0], wheels, tmp_path / "venv")
    freeze = _run(["uv", "pip", "freeze", "--python", python])
    names = {line.split("==")[0].split(" @ ")[0].lower() for line in freeze.splitlines() if line}
    assert names == MAZE_ENV_DISTRIBUTIONS
    readme = (ROOT / "packages" / "maze-env" / "README.md").read_text()
    assert readme.index("pip install maze-env") < readme.index("## ")  # it opens with the install
    example = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert len([line for line in example.splitlines() if line.strip()]) <= 10
    (tmp_path / "example.py").write_text(example)
    out = _run([python, "example.py"], cwd=tmp_path)
    assert out.splitlines()[0] == "(225, 225, 3) 0.0 12"
    assert "A" in out and "T" in out  # the ASCII maze: agent and target
    assert (tmp_path / "maze.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_every_dependency_has_a_floor_and_siblings_one_minor_series() -> None:
    from packaging.requirements import Requirement
    from packaging.version import Version

    siblings = {str(_meta(m)["name"]): Version(str(_meta(m)["version"])) for m in MEMBERS}
    for member in MEMBERS:
        meta = _meta(member)
        reqs = list(cast(list[str], meta.get("dependencies", [])))
        extras = cast(dict[str, list[str]], meta.get("optional-dependencies", {}))
        reqs += [r for rs in extras.values() for r in rs]
        for raw in reqs:
            req = Requirement(raw)
            floors = [Version(s.version) for s in req.specifier if s.operator == ">="]
            assert floors, f"{member.name}: {raw} has no lower bound"
            if req.name in siblings:
                # 0.x semver: a minor bump breaks, so a sibling range stays in one minor series.
                (floor,) = floors
                ceiling = Version(f"{floor.major}.{floor.minor + 1}")
                assert req.specifier == type(req.specifier)(f">={floor},<{ceiling}"), raw
                assert req.specifier.contains(siblings[req.name]), (
                    f"{member.name}: {raw} excludes the workspace's {req.name} {siblings[req.name]}"
                )
