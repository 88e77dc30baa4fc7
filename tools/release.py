"""Versions, changelogs and releases of the workspace's packages, each on its own.

    uv run python tools/release.py check                   # CI: every change is bumped and logged
    uv run python tools/release.py build PACKAGE           # sdist + wheel, checked, installed alone
    uv run python tools/release.py publish PACKAGE         # upload, tag, record (needs a registry)

A package's *shipped files* are what its wheel and metadata are made of: the files under its
wheel's package directories (``[tool.hatch.build.targets.wheel] packages``), its README (the
long description) and the packaging tables of its ``pyproject.toml`` (``[project]``,
``[build-system]``, ``[tool.hatch]``; tool settings such as ruff's are not shipped). Every release
is recorded in ``releases.json`` (version, tag ``<package>-v<version>``, the sha256 of each
shipped file) beside the git tag, so the check works in a shallow clone or an export without
tags; where the tag is present, the record must agree with it.

``check`` fails, naming the package and the files, when a package's shipped files differ from its
last release while its version is not above the released one, or its CHANGELOG.md has no entry
for its version. ``publish`` takes the registry from ``MAZERL_REGISTRY_URL`` and the token from
``MAZERL_REGISTRY_TOKEN`` (uploaded with twine as ``__token__``); it refuses without them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[1]
RECORD = "releases.json"
SHIPPED_TABLES = ("project", "build-system")
# Keep a Changelog headings: "## [0.1.0] - 2026-12-01" (or "## [Unreleased]").
_HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?\s*$")


class ReleaseError(Exception):
    """A check or release step that failed; the message names the package and what to do."""


@dataclass(frozen=True)
class Member:
    """One workspace member: where it is and what its pyproject says."""

    name: str
    version: str
    path: Path
    pyproject: dict[str, Any]

    @property
    def tag(self) -> str:
        """The release tag of the current version."""
        return release_tag(self.name, self.version)

    @property
    def module(self) -> str:
        """The import name (one top-level package per member)."""
        return self.name.replace("-", "_")


@dataclass(frozen=True)
class Release:
    """One package's last release as ``releases.json`` records it."""

    version: str
    tag: str
    files: dict[str, str]


def release_tag(name: str, version: str) -> str:
    """``<package>-v<version>``, the one tag format."""
    return f"{name}-v{version}"


def members(root: Path = ROOT) -> list[Member]:
    """Every package and app of the workspace, packages first, each sorted by directory."""
    found: list[Member] = []
    for group in ("packages", "apps"):
        for pyproject in sorted((root / group).glob("*/pyproject.toml")):
            data = tomllib.loads(pyproject.read_text())
            project = data["project"]
            found.append(Member(project["name"], project["version"], pyproject.parent, data))
    return found


def member(name: str, root: Path = ROOT) -> Member:
    """The member called ``name``.

    Raises:
        ReleaseError: No member has that name.
    """
    for m in members(root):
        if m.name == name:
            return m
    known = ", ".join(m.name for m in members(root))
    raise ReleaseError(f"no workspace package named {name!r} (known: {known})")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _packaging_tables(m: Member) -> bytes:
    tables: dict[str, object] = {k: m.pyproject[k] for k in SHIPPED_TABLES if k in m.pyproject}
    tool = m.pyproject.get("tool")
    if isinstance(tool, dict) and "hatch" in tool:
        tables["tool.hatch"] = tool["hatch"]
    return json.dumps(tables, sort_keys=True, indent=1).encode()


def _wheel_dirs(m: Member) -> list[Path]:
    try:
        packages: list[str] = m.pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    except (KeyError, TypeError):
        packages = []
    if not packages:
        raise ReleaseError(
            f"{m.name}: pyproject.toml names no [tool.hatch.build.targets.wheel] packages"
        )
    return [m.path / p for p in packages]


def shipped_digests(m: Member) -> dict[str, str]:
    """sha256 of each shipped file, by path relative to the repository root.

    The packaging tables of ``pyproject.toml`` are hashed as canonical JSON under the key
    ``<dir>/pyproject.toml[packaging]``, so a change to tool settings alone ships nothing.
    """
    repo = m.path.parents[1]
    digests: dict[str, str] = {}
    for top in _wheel_dirs(m):
        for path in sorted(top.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                digests[path.relative_to(repo).as_posix()] = _sha256(path.read_bytes())
    base = m.path.relative_to(repo).as_posix()
    readme = m.path / "README.md"
    if readme.is_file():
        digests[f"{base}/README.md"] = _sha256(readme.read_bytes())
    digests[f"{base}/pyproject.toml[packaging]"] = _sha256(_packaging_tables(m))
    return dict(sorted(digests.items()))


def load_record(root: Path = ROOT) -> dict[str, Release]:
    """``releases.json``: per package its last release (an empty mapping if none yet).

    Raises:
        ReleaseError: The file is not valid JSON of the expected shape.
    """
    path = root / RECORD
    if not path.exists():
        return {}
    try:
        data: Any = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ReleaseError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ReleaseError(f"{path}: expected an object of package -> release")
    entries = cast(dict[str, Any], data)
    out: dict[str, Release] = {}
    for name, entry in entries.items():
        try:
            files: dict[str, Any] = entry["files"]
            out[name] = Release(
                str(entry["version"]), str(entry["tag"]), {k: str(v) for k, v in files.items()}
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ReleaseError(
                f"{path}: expected package -> {{version, tag, files}}; bad entry {name!r}"
            ) from exc
    return out


def write_record(record: dict[str, Release], root: Path = ROOT) -> None:
    """Rewrite ``releases.json`` atomically (sorted, one stable layout for review)."""
    path = root / RECORD
    tmp = path.with_name(f".{path.name}.tmp")
    data = {
        name: {"version": r.version, "tag": r.tag, "files": r.files}
        for name, r in sorted(record.items())
    }
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def changelog_versions(m: Member) -> dict[str, list[str]]:
    """Version -> its entry lines in the member's CHANGELOG.md.

    Raises:
        ReleaseError: The member has no CHANGELOG.md.
    """
    path = m.path / "CHANGELOG.md"
    if not path.is_file():
        raise ReleaseError(f"{m.name}: {path.relative_to(m.path.parents[1])} is missing")
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in path.read_text().splitlines():
        match = _HEADING.match(line)
        if match:
            current = sections.setdefault(match["version"], [])
        elif current is not None and line.lstrip().startswith("- "):
            current.append(line.strip())
    return sections


def _git(*args: str, root: Path = ROOT) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, check=False)


def _tag_digests(tag: str, m: Member, paths: list[str]) -> dict[str, str] | None:
    """sha256 of ``paths`` as the git tag holds them; None where git or the tag is absent."""
    repo = m.path.parents[1]
    if shutil.which("git") is None:
        return None
    if _git("rev-parse", "-q", "--verify", f"refs/tags/{tag}", root=repo).returncode:
        return None
    out: dict[str, str] = {}
    for rel in paths:
        if rel.endswith("[packaging]"):
            continue  # derived from pyproject.toml; its other tables may differ legitimately
        shown = _git("show", f"{tag}:{rel}", root=repo)
        out[rel] = _sha256(shown.stdout) if shown.returncode == 0 else "absent"
    return out


def check_member(m: Member, record: dict[str, Release]) -> list[str]:
    """Problems that keep ``m`` from being consistent with its last release (empty: none)."""
    problems: list[str] = []
    try:
        current = Version(m.version)
    except InvalidVersion:
        return [f"{m.name}: version {m.version!r} is not a PEP 440 version"]
    try:
        log = changelog_versions(m)
    except ReleaseError as exc:
        return [str(exc)]
    if not log.get(m.version):
        problems.append(
            f"{m.name}: CHANGELOG.md has no entry for {m.version} "
            f"(add '## [{m.version}] - YYYY-MM-DD' with at least one '- ' line)"
        )
    released = record.get(m.name)
    if released is None:
        problems.append(
            f"{m.name}: never released: {RECORD} has no entry "
            f"(run `uv run python tools/release.py publish {m.name}`)"
        )
        return problems
    files, version = released.files, released.version
    now = shipped_digests(m)
    changed = sorted(path for path in set(now) | set(files) if now.get(path) != files.get(path))
    tagged = _tag_digests(released.tag, m, sorted(files))
    if tagged is not None:
        differs = sorted(p for p, d in tagged.items() if files.get(p) != d)
        if differs:
            problems.append(
                f"{m.name}: {RECORD} does not match tag {released.tag}: {', '.join(differs)}"
            )
    if changed and current <= Version(version):
        shown = ", ".join(changed[:10]) + (
            f" and {len(changed) - 10} more" if len(changed) > 10 else ""
        )
        problems.append(
            f"{m.name}: shipped files changed since {release_tag(m.name, version)} without a "
            f"version bump (still {m.version}): {shown}. Bump [project] version in "
            f"{(m.path / 'pyproject.toml').relative_to(m.path.parents[1])} and add its "
            "CHANGELOG.md entry."
        )
    if current < Version(version):
        problems.append(f"{m.name}: version {m.version} is below the released {version}")
    return problems


def check(root: Path = ROOT) -> list[str]:
    """Problems over the whole workspace."""
    record = load_record(root)
    problems: list[str] = []
    names = {m.name for m in members(root)}
    for m in members(root):
        problems += check_member(m, record)
    problems += [
        f"{RECORD}: {name} is not a workspace package" for name in record if name not in names
    ]
    return problems


def run(
    cmd: list[str],
    *,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> str:
    """Run ``cmd``; its stdout, or a :class:`ReleaseError` with the tail of its output."""
    proc = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, check=False, env=env, timeout=timeout
    )
    if proc.returncode:
        raise ReleaseError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-6000:]}{proc.stderr[-3000:]}"
        )
    return proc.stdout


def clean_env(venv: Path | None = None) -> dict[str, str]:
    """This environment without the workspace's venv; with ``venv``, that venv activated."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
    }
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def build_wheels(out: Path) -> dict[str, Path]:
    """Every workspace member's wheel, built into ``out`` in one call; name -> wheel.

    Raises:
        ReleaseError: The build failed or a member's wheel is not where it should be.
    """
    run(["uv", "build", "--all-packages", "--wheel", "--out-dir", str(out)], env=clean_env())
    wheels: dict[str, Path] = {}
    for m in members():
        found = sorted(out.glob(f"{m.module}-{m.version}-*.whl"))
        if len(found) != 1:
            raise ReleaseError(f"{m.name}: expected one wheel in {out}, found {found}")
        wheels[canonicalize_name(m.name)] = found[0]
    return wheels


def build(m: Member, out: Path) -> list[Path]:
    """Build ``m``'s sdist and wheel into ``out``, check them, install the wheel alone, import it.

    Workspace siblings it depends on are built as wheels into ``out/deps`` and offered to the
    installer as an index would; nothing else of the workspace is on the path.

    Raises:
        ReleaseError: A build, the metadata check, the install or the import failed.
    """
    out.mkdir(parents=True, exist_ok=True)
    env = clean_env()
    run(["uv", "build", "--package", m.name, "--sdist", "--wheel", "--out-dir", str(out)], env=env)
    stem = m.module
    artifacts = sorted(out.glob(f"{stem}-{m.version}.tar.gz")) + sorted(
        out.glob(f"{stem}-{m.version}-*.whl")
    )
    if len(artifacts) != 2:
        raise ReleaseError(
            f"{m.name}: expected one sdist and one wheel in {out}, found {artifacts}"
        )
    run([sys.executable, "-m", "twine", "check", "--strict", *map(str, artifacts)])
    deps = out / "deps"
    build_wheels(deps)  # siblings, offered as an index would; the package's own is not used
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        run(["uv", "venv", "--quiet", "--python", "3.12", str(venv)], env=env)
        python = str(venv / "bin" / "python")
        wheel = artifacts[1]
        run(
            [
                "uv",
                "pip",
                "install",
                "--quiet",
                "--python",
                python,
                "--find-links",
                str(deps),
                str(wheel),
            ],
            env=env,
        )
        code = f"import {stem}, pathlib; print(pathlib.Path({stem}.__file__).parent)"
        where = run([python, "-c", code], cwd=Path(tmp), env=env).strip()
        if "site-packages" not in where:
            raise ReleaseError(f"{m.name}: imported from {where}, not from the installed wheel")
    return artifacts


def record_release(m: Member) -> None:
    """Record ``m``'s current version and shipped files as released, and tag the commit.

    Raises:
        ReleaseError: The version was recorded already, ``m`` is inconsistent (see
            :func:`check_member`), or the tag exists.
    """
    repo = m.path.parents[1]
    record = load_record(repo)
    released = record.get(m.name)
    if released is not None and released.version == m.version:
        raise ReleaseError(f"{m.name}: {m.version} is released already ({released.tag})")
    problems = [p for p in check_member(m, record) if "never released" not in p]
    if problems:
        raise ReleaseError("; ".join(problems))
    if (
        shutil.which("git") is not None
        and _git("rev-parse", "--git-dir", root=repo).returncode == 0
    ):
        tagged = _git("tag", "-a", m.tag, "-m", f"{m.name} {m.version}", root=repo)
        if tagged.returncode:
            raise ReleaseError(f"git tag {m.tag}: {tagged.stderr.decode().strip()}")
    record[m.name] = Release(m.version, m.tag, shipped_digests(m))
    write_record(record, repo)


def upload(artifacts: list[Path], *, url: str, token: str) -> None:
    """Upload ``artifacts`` to the registry at ``url`` with twine, as ``__token__``.

    Raises:
        ReleaseError: The upload failed.
    """
    env = {**os.environ, "TWINE_USERNAME": "__token__", "TWINE_PASSWORD": token}
    cmd = [sys.executable, "-m", "twine", "upload", "--non-interactive"]
    run([*cmd, "--repository-url", url, *map(str, artifacts)], env=env)


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit 1 on a failed check or step, 2 on bad usage."""
    parser = argparse.ArgumentParser(
        prog="tools/release.py", description=(__doc__ or "").splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "check", help="fail when a package changed without a version bump and changelog entry"
    )
    for name, text in (
        ("build", "build, check and install one package's sdist and wheel; print what would go"),
        ("publish", "build, upload, record and tag one package"),
        ("record", "record and tag the current version as released, without uploading"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("package", help="the package's distribution name, e.g. maze-env")
        if name != "record":
            p.add_argument(
                "--out",
                type=Path,
                default=None,
                help="artifact directory (default: dist/<package>)",
            )
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            problems = check()
            for problem in problems:
                print(f"release check: {problem}", file=sys.stderr)
            if problems:
                return 1
            print(f"release check: {len(members())} packages consistent with {RECORD}")
            return 0
        m = member(args.package)
        if args.command == "record":
            record_release(m)
            print(f"recorded {m.name} {m.version} in {RECORD}; tagged {m.tag}")
            return 0
        url = os.environ.get("MAZERL_REGISTRY_URL", "")
        token = os.environ.get("MAZERL_REGISTRY_TOKEN", "")
        if args.command == "publish" and not (url and token):
            raise ReleaseError(
                "publish needs MAZERL_REGISTRY_URL and MAZERL_REGISTRY_TOKEN in the environment"
            )
        if args.command == "publish":
            # Refuse before building: a version that is released or inconsistent never uploads.
            record = load_record()
            released = record.get(m.name)
            if released is not None and released.version == m.version:
                raise ReleaseError(f"{m.name}: {m.version} is released already ({m.tag})")
            problems = [p for p in check_member(m, record) if "never released" not in p]
            if problems:
                raise ReleaseError("; ".join(problems))
        artifacts = build(m, args.out or ROOT / "dist" / m.name)
        for a in artifacts:
            print(f"{a}  sha256 {_sha256(a.read_bytes())}")
        if args.command == "build":
            where = url or "$MAZERL_REGISTRY_URL (not set)"
            print(f"would publish {m.name} {m.version} as tag {m.tag} to {where}")
            return 0
        upload(artifacts, url=url, token=token)
        record_release(m)
        print(f"published {m.name} {m.version} to {url}; recorded in {RECORD}; tagged {m.tag}")
        return 0
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
