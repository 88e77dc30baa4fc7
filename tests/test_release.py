"""The version check, the release record and tags, and the release path, on real copies of the repo.

Each test works on a copy of the workspace's files (``git ls-files``), so bumps, records and tags
never touch this checkout. Publishing goes to a real package index (pypiserver) on 127.0.0.1.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
VERIFIER_FILE = "packages/maze-verifier/src/maze_verifier/__init__.py"


def _copy_repo(dest: Path) -> Path:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in files:
        if not raw:
            continue
        rel = raw.decode()
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def _release(
    repo: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(repo / "tools" / "release.py"), *args],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env=env,
    )


def _bump(repo: Path, package_dir: str, old: str, new: str, *, log: bool) -> None:
    pyproject = repo / package_dir / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace(f'version = "{old}"', f'version = "{new}"', 1)
    )
    if log:
        changelog = repo / package_dir / "CHANGELOG.md"
        text = changelog.read_text()
        changelog.write_text(
            text.replace(
                "## [Unreleased]\n",
                f"## [Unreleased]\n\n## [{new}] - 2026-12-02\n\n### Fixed\n\n- A test change.\n",
                1,
            )
        )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return _copy_repo(tmp_path / "repo")


def test_the_workspace_is_consistent_with_its_releases() -> None:
    proc = _release(ROOT, "check")
    assert proc.returncode == 0, proc.stderr
    assert "packages consistent with releases.json" in proc.stdout


def test_every_member_has_a_changelog_entry_for_its_version_and_a_release() -> None:
    import json

    from packaging.version import Version

    record = json.loads((ROOT / "releases.json").read_text())
    for pyproject in sorted(ROOT.glob("*/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        log = (pyproject.parent / "CHANGELOG.md").read_text()
        assert f"## [{project['version']}] - " in log, pyproject
        assert "Semantic Versioning" in log
        # The last release, at or below the version in the tree (a bump waits for its release).
        released = record[project["name"]]
        assert released["tag"] == f"{project['name']}-v{released['version']}"
        assert Version(released["version"]) <= Version(project["version"]), pyproject


def test_a_changed_shipped_file_without_a_bump_fails_naming_package_and_file(repo: Path) -> None:
    target = repo / VERIFIER_FILE
    target.write_text(target.read_text() + "\n# a change\n")
    proc = _release(repo, "check")
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.startswith("release check:")]
    assert len(lines) == 1, proc.stderr
    assert "maze-verifier: shipped files changed since maze-verifier-v0.1.0" in lines[0]
    assert VERIFIER_FILE in lines[0]

    # A bump alone is not enough: the changelog must say what changed.
    _bump(repo, "packages/maze-verifier", "0.1.0", "0.1.1", log=False)
    proc = _release(repo, "check")
    assert proc.returncode == 1
    assert "maze-verifier: CHANGELOG.md has no entry for 0.1.1" in proc.stderr

    _bump(repo, "packages/maze-verifier", "0.1.1", "0.1.1", log=True)
    proc = _release(repo, "check")
    assert proc.returncode == 0, proc.stderr


def test_tests_tool_settings_and_changelog_are_not_shipped(repo: Path) -> None:
    pkg = repo / "packages" / "maze-verifier"
    (pkg / "tests" / "test_path_answers.py").write_text("# rewritten\n")
    (pkg / "CHANGELOG.md").write_text((pkg / "CHANGELOG.md").read_text() + "\n")
    pyproject = pkg / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "\n[tool.coverage]\nbranch = true\n")
    assert _release(repo, "check").returncode == 0
    # ... but the packaging tables are: a new dependency is a change users get.
    pyproject.write_text(
        pyproject.read_text().replace('"skyrl-gym>=0.4,<0.5",', '"skyrl-gym>=0.4,<0.5", "rich",')
    )
    proc = _release(repo, "check")
    assert proc.returncode == 1
    assert "packages/maze-verifier/pyproject.toml[packaging]" in proc.stderr


def test_a_record_that_disagrees_with_its_git_tag_fails(repo: Path) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    git = ["git", "-c", "init.defaultBranch=main"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run([*git, *cmd], cwd=repo, check=True, env=env)
    # Release maze-verifier 0.1.1 for real (record + tag), then doctor the record.
    target = repo / VERIFIER_FILE
    target.write_text(target.read_text() + "\n# a change\n")
    _bump(repo, "packages/maze-verifier", "0.1.0", "0.1.1", log=True)
    subprocess.run([*git, "commit", "-qam", "verifier 0.1.1"], cwd=repo, check=True, env=env)
    proc = _release(repo, "record", "maze-verifier", env=env)
    assert proc.returncode == 0, proc.stderr
    tags = subprocess.run(["git", "tag"], cwd=repo, capture_output=True, text=True, check=True)
    assert "maze-verifier-v0.1.1" in tags.stdout.split()
    assert _release(repo, "check").returncode == 0
    assert "already" in _release(repo, "record", "maze-verifier", env=env).stderr
    record = repo / "releases.json"
    record.write_text(
        record.read_text().replace(
            '"packages/maze-verifier/README.md": "', '"packages/maze-verifier/README.md": "0', 1
        )
    )
    proc = _release(repo, "check")
    assert proc.returncode == 1
    assert "maze-verifier: releases.json does not match tag maze-verifier-v0.1.1" in proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_build_then_publish_to_a_real_index(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "dist"
    proc = _release(repo, "build", "maze-verifier", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "would publish maze-verifier 0.1.0 as tag maze-verifier-v0.1.0" in proc.stdout
    assert {p.name for p in out.glob("maze_verifier-*")} == {
        "maze_verifier-0.1.0.tar.gz",
        "maze_verifier-0.1.0-py3-none-any.whl",
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAZERL_REGISTRY")}
    proc = _release(repo, "publish", "maze-verifier", env=env)
    assert proc.returncode == 1
    assert "MAZERL_REGISTRY_URL and MAZERL_REGISTRY_TOKEN" in proc.stderr
    # The released version cannot go out again.
    env |= {"MAZERL_REGISTRY_URL": "http://127.0.0.1:9/", "MAZERL_REGISTRY_TOKEN": "t"}
    assert "released already" in _release(repo, "publish", "maze-verifier", env=env).stderr

    packages = tmp_path / "index"
    packages.mkdir()
    port = _free_port()
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "pypi-server"),
            "run",
            "-i",
            "127.0.0.1",
            "-p",
            str(port),
            "-a",
            ".",
            "-P",
            ".",
            str(packages),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/simple/", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            pytest.fail("pypiserver did not come up")
        target = repo / "packages/maze-verifier/src/maze_verifier/__init__.py"
        target.write_text(target.read_text() + "\n# a change\n")
        _bump(repo, "packages/maze-verifier", "0.1.0", "0.1.1", log=True)
        env["MAZERL_REGISTRY_URL"] = f"http://127.0.0.1:{port}/"
        proc = _release(repo, "publish", "maze-verifier", "--out", str(tmp_path / "dist2"), env=env)
        assert proc.returncode == 0, proc.stderr
        assert {p.name for p in packages.iterdir()} == {
            "maze_verifier-0.1.1.tar.gz",
            "maze_verifier-0.1.1-py3-none-any.whl",
        }
        assert _release(repo, "check").returncode == 0  # recorded: the change is released
        index = httpx.get(f"http://127.0.0.1:{port}/simple/maze-verifier/", timeout=5).text
        assert "maze_verifier-0.1.1-py3-none-any.whl" in index
    finally:
        server.terminate()
        server.wait(timeout=10)
