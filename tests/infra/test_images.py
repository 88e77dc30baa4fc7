"""The container images of ``infra/images/``, checked statically (no Docker daemon here).

Every ``*.Dockerfile`` is parsed with ``dockerfile-parse`` and checked against the repository it
is built from (the repository root is the build context): COPY/ADD sources exist and survive
``.dockerignore``; ENTRYPOINT/CMD/HEALTHCHECK run a console script of the workspace (installed
by the image's ``uv sync --package``) or a whitelisted system binary; the Python it installs is
``.python-version``'s; the workspace is installed from ``uv.lock`` (``--frozen``/``--locked``)
and anything layered on top is pinned. The serve image must start ``maze-serve serve`` on 8080
with arguments ``maze-serve``'s own parser accepts. The checker is run on altered copies too, so
that each rule is seen failing.
"""

from __future__ import annotations

import glob
import json
import re
import shlex
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, cast

import pytest
from dockerfile_parse import DockerfileParser

from maze_infra.endpoint import EndpointSpec
from maze_server import cli as serve_cli

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "infra" / "images"
DOCKERFILES = sorted(IMAGES.glob("*.Dockerfile"))
PYTHON = (ROOT / ".python-version").read_text().strip()
SAGEMAKER_PORT = 8080

# Executables an image may run that are not workspace console scripts, each with its reason.
SYSTEM_BINARIES = {
    "python": "the venv's interpreter on PATH; the serve image's HEALTHCHECK fetches /ping with "
    "the standard library, so the image needs no curl",
}
# uv pip install options that take a value (so the value is not read as a requirement).
_UV_PIP_VALUE_OPTIONS = {
    "--python",
    "-p",
    "--index-url",
    "-i",
    "--extra-index-url",
    "--index-strategy",
    "--find-links",
    "-f",
    "--override",
    "--constraint",
    "-c",
    "--no-build-isolation-package",
    "-r",
    "--requirement",
}


# --- the repository ---------------------------------------------------------------------


@cache
def workspace_scripts() -> dict[str, str]:
    """Console script -> workspace member that declares it."""
    scripts: dict[str, str] = {}
    for pyproject in sorted(
        [*ROOT.glob("packages/*/pyproject.toml"), *ROOT.glob("apps/*/pyproject.toml")]
    ):
        project = tomllib.loads(pyproject.read_text())["project"]
        for script in project.get("scripts", {}):
            scripts[script] = project["name"]
    return scripts


@cache
def lock() -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in tomllib.loads((ROOT / "uv.lock").read_text())["package"]}


def closure(member: str) -> set[str]:
    """Every package ``uv sync --package member`` installs (all markers, extras followed)."""
    packages = lock()
    seen: set[str] = set()
    todo: list[tuple[str, tuple[str, ...]]] = [(member, ())]
    while todo:
        name, extras = todo.pop()
        key = f"{name}[{','.join(extras)}]"
        if key in seen:
            continue
        seen.add(key)
        pkg = packages[name]
        deps: list[dict[str, Any]] = list(pkg.get("dependencies", []))
        optional: dict[str, list[dict[str, Any]]] = pkg.get("optional-dependencies", {})
        for extra in extras:
            deps += optional.get(extra, [])
        for dep in deps:
            todo.append((str(dep["name"]), tuple(sorted(dep.get("extra", [])))))
    return {k.split("[", 1)[0] for k in seen}


@cache
def dockerignore() -> list[tuple[bool, re.Pattern[str]]]:
    """``.dockerignore`` as (is_exception, regex) pairs, in file order."""
    rules: list[tuple[bool, re.Pattern[str]]] = []
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.removeprefix("!").strip().strip("/")
        regex = ""
        for part in re.split(r"(\*\*/?|\*|\?)", pattern):
            if part.startswith("**"):
                regex += "(?:.*/)?" if part.endswith("/") else ".*"
            elif part == "*":
                regex += "[^/]*"
            elif part == "?":
                regex += "[^/]"
            else:
                regex += re.escape(part)
        rules.append((negate, re.compile(regex)))
    return rules


def ignored(rel: str) -> bool:
    """Whether Docker leaves ``rel`` (relative to the context) out of the build context."""
    parts = Path(rel).parts
    result = False
    for negate, regex in dockerignore():
        # A pattern that matches a parent directory leaves out everything below it.
        if any(regex.fullmatch("/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            result = not negate
    return result


# --- the Dockerfile -----------------------------------------------------------------------


@dataclass
class Stage:
    """One FROM ... stage: its image and instructions, with ARG/ENV values."""

    image: str
    instructions: list[tuple[str, str]] = field(default_factory=list[tuple[str, str]])
    env: dict[str, str] = field(default_factory=dict[str, str])


def parse(path: Path) -> list[Stage]:
    parser = DockerfileParser(path=str(path))
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for item in parser.structure:
        instruction, value = str(item["instruction"]), str(item["value"])
        if instruction == "COMMENT":
            continue
        if instruction == "FROM":
            # ARGs declared before the first FROM are in scope for FROM lines only.
            stages.append(Stage(image=substitute(value.split(maxsplit=1)[0], args)))
            continue
        if instruction == "ARG":
            name, _, default = value.partition("=")
            (args if not stages else stages[-1].env)[name.strip()] = default.strip().strip('"')
            continue
        if not stages:
            continue
        stage = stages[-1]
        stage.instructions.append((instruction, value))
        if instruction == "ENV":
            stage.env.update(env_pairs(value))
    return stages


def env_pairs(value: str) -> dict[str, str]:
    tokens = shlex.split(value)
    if tokens and "=" not in tokens[0]:  # legacy `ENV KEY value`
        return {tokens[0]: " ".join(tokens[1:])}
    return dict(t.split("=", 1) for t in tokens)


def substitute(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m[1] or m[2], m[0]), text)


def exec_form(value: str) -> list[str] | None:
    """The JSON array of an exec-form instruction, or ``None`` for the shell form."""
    try:
        parsed: Any = json.loads(value)
    except json.JSONDecodeError:
        return None
    return [str(x) for x in cast(list[Any], parsed)] if isinstance(parsed, list) else None


def copy_sources(value: str) -> tuple[list[str], str] | None:
    """Sources and destination of a COPY/ADD from the build context (``None``: --from)."""
    tokens = exec_form(value) or shlex.split(value)
    if any(t.startswith("--from") for t in tokens):
        return None
    tokens = [t for t in tokens if not t.startswith("--")]
    return tokens[:-1], tokens[-1]


def shell_commands(script: str) -> Iterable[list[str]]:
    for part in re.split(r"&&|\|\||;|\|", script):
        words = shlex.split(part.replace("\\\n", " "))
        if words:
            yield words


def image_argv(stages: list[Stage]) -> tuple[list[str] | None, str | None]:
    """What ``docker run IMAGE`` executes, or a problem with the final stage's commands."""
    entrypoint = cmd = None
    for instruction, value in stages[-1].instructions:
        if instruction == "ENTRYPOINT":
            entrypoint = value
        elif instruction == "CMD":
            cmd = value
    if entrypoint is not None:
        ep = exec_form(entrypoint)
        if not ep:
            return (
                None,
                f"ENTRYPOINT {entrypoint!r} is shell form: it would ignore `docker run IMAGE serve`",
            )
        return ep + ((exec_form(cmd) or []) if cmd else []), None
    if cmd is None:
        return None, "the final stage has neither ENTRYPOINT nor CMD"
    argv = exec_form(cmd)
    if not argv:
        return None, f"CMD {cmd!r} is shell form"
    return argv, None


def check(path: Path) -> list[str]:
    """Every problem of the Dockerfile at ``path``, built with the repository as context."""
    problems: list[str] = []
    stages = parse(path)
    if not stages:
        return [f"{path.name}: no FROM"]
    synced: list[str] = []
    venvs: set[str] = set()
    copies: dict[str, Path] = {}
    pythons: list[tuple[int, str]] = []

    for index, stage in enumerate(stages):
        if m := re.search(r"(?:^|/)python:(\d+\.\d+)", stage.image):
            pythons.append((index, m[1]))
        synced_here = False
        for instruction, raw in stage.instructions:
            value = substitute(raw, stage.env)
            if instruction in ("COPY", "ADD"):
                found = copy_sources(value)
                if found is None:
                    continue
                sources, dest = found
                for src in sources:
                    problems += context_problems(instruction, src)
                    if dest.startswith("/") and len(sources) == 1:
                        copies[dest] = ROOT / src
            elif instruction == "ENV":
                if "UV_PROJECT_ENVIRONMENT" in env_pairs(value):
                    venvs.add(env_pairs(value)["UV_PROJECT_ENVIRONMENT"])
                if m := re.fullmatch(r"python(\d+\.\d+)", env_pairs(value).get("UV_PYTHON", "")):
                    pythons.append((index, m[1]))
            elif instruction == "RUN":
                for words in shell_commands(value):
                    problems += run_problems(words, synced_here, copies, pythons, index)
                    if words[:2] == ["uv", "sync"]:
                        synced_here = True
                        if "--package" in words:
                            synced.append(words[words.index("--package") + 1])

    if not synced:
        problems.append(
            "no `uv sync --frozen --package MEMBER`: the workspace is not installed from uv.lock"
        )
    versions = {v for _, v in pythons}
    if versions != {PYTHON}:
        problems.append(
            f"installs Python {sorted(versions) or 'none'}, .python-version says {PYTHON}"
        )
    elif not any(i == len(stages) - 1 for i, _ in pythons):
        problems.append("the final stage does not say which Python it runs")

    installed: set[str] = set()
    for member in synced:
        installed |= closure(member) if member in lock() else set()
    argv, problem = image_argv(stages)
    if problem:
        problems.append(problem)
    runs: list[tuple[str, list[str]]] = [("ENTRYPOINT/CMD", argv)] if argv else []
    for instruction, value in stages[-1].instructions:
        parts = re.split(r"(?:^|\s)CMD\s+", value, maxsplit=1)
        if instruction == "HEALTHCHECK" and len(parts) == 2:
            hc = exec_form(parts[1].strip())
            if hc is None:
                problems.append("HEALTHCHECK CMD is not exec form")
            else:
                runs.append(("HEALTHCHECK", hc))
    for what, command in runs:
        exe = command[0]
        owner = workspace_scripts().get(exe)
        if owner is None and exe not in SYSTEM_BINARIES:
            problems.append(f"{what} runs {exe!r}: not a workspace console script nor whitelisted")
        elif owner is not None and owner not in installed:
            problems.append(
                f"{what} runs {exe!r} of {owner}, which no `uv sync --package` installs"
            )
    path_env = stages[-1].env.get("PATH", "")
    if not any(f"{venv}/bin" in path_env.split(":") for venv in venvs):
        problems.append(
            f"the final stage's PATH {path_env!r} lacks the venv's bin ({sorted(venvs)})"
        )
    return problems


def context_problems(instruction: str, src: str) -> list[str]:
    if re.match(r"[a-z]+://", src):
        return [f"{instruction} {src}: remote sources are not reproducible"]
    matches = [Path(p) for p in glob.glob(str(ROOT / src))]
    if not matches:
        return [f"{instruction} {src}: no such path in the build context"]
    problems: list[str] = []
    for match in matches:
        rel = match.relative_to(ROOT).as_posix()
        if ignored(rel):
            problems.append(f"{instruction} {src}: {rel} is excluded by .dockerignore")
        # A copied workspace member must keep what uv and hatchling read to build it.
        members = [match] if (match / "pyproject.toml").is_file() else []
        members += [p.parent for p in match.glob("*/pyproject.toml")] if match.is_dir() else []
        for member in members:
            for needed in ("pyproject.toml", "README.md", "src"):
                need = (member / needed).relative_to(ROOT).as_posix()
                if (ROOT / need).exists() and ignored(need):
                    problems.append(f"{instruction} {src}: {need} is excluded by .dockerignore")
    return problems


def run_problems(
    words: list[str],
    synced: bool,
    copies: dict[str, Path],
    pythons: list[tuple[int, str]],
    stage: int,
) -> list[str]:
    """The problems of one shell command of a RUN."""
    problems: list[str] = []
    if words[:1] == ["apt-get"] and "install" in words:
        for word in words:
            if m := re.fullmatch(r"python(\d+\.\d+)(?:-\w+)?", word):
                pythons.append((stage, m[1]))
    if words[:3] == ["uv", "python", "install"] and len(words) > 3:
        pythons.append((stage, words[3]))
    if words[:2] in (["uv", "sync"], ["uv", "export"]):
        if not {"--frozen", "--locked"} & set(words):
            problems.append(f"`{' '.join(words)}` does not use the lock (--frozen or --locked)")
        if words[1] == "sync" and "--no-dev" not in words:
            problems.append(f"`{' '.join(words)}` installs the dev tools (no --no-dev)")
        if "--package" in words and words[words.index("--package") + 1] not in lock():
            problems.append(f"`{' '.join(words)}`: no workspace member of that name")
    if words[:3] == ["uv", "pip", "install"]:
        if not synced:
            problems.append("`uv pip install` before `uv sync --frozen`: layer pins on the lock")
        problems += pip_install_problems(words[3:], copies)
    if "pip" in words[:3] and "install" in words and words[:1] != ["uv"]:
        problems.append(f"`{' '.join(words)}`: install through uv, from the lock")
    return problems


def pip_install_problems(args: list[str], copies: dict[str, Path]) -> list[str]:
    problems: list[str] = []
    it = iter(args)
    for arg in it:
        if arg in _UV_PIP_VALUE_OPTIONS:
            value = next(it, "")
            if arg in ("--override", "--constraint", "-c"):
                source = copies.get(value)
                if source is None:
                    problems.append(f"{arg} {value}: not a file the Dockerfile copies in")
                else:
                    problems += override_problems(source)
            continue
        if arg.startswith("-"):
            continue
        if "==" not in arg:
            problems.append(f"`uv pip install {arg}`: not pinned (==)")
    return problems


def override_problems(source: Path) -> list[str]:
    """Pins of packages the lock also holds must be the locked versions."""
    problems: list[str] = []
    for raw in source.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if m := re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s;]+)", line):
            name, version = m[1].lower().replace("_", "-"), m[2]
            locked = lock().get(name, {}).get("version")
            if locked is not None and locked != version:
                problems.append(f"{source.name}: {name}=={version}, but uv.lock has {locked}")
    return problems


# --- the serve image ----------------------------------------------------------------------


def serve_problems(path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """``docker run IMAGE serve`` must be maze-serve's SageMaker mode on the exposed 8080."""
    stages = parse(path)
    argv, problem = image_argv(stages)
    if argv is None:
        return [problem or "no command"]
    # SageMaker runs `docker run IMAGE serve`: `serve` replaces CMD, after the ENTRYPOINT.
    entrypoint = next(
        (exec_form(v) for i, v in reversed(stages[-1].instructions) if i == "ENTRYPOINT"), None
    )
    if not entrypoint:
        return ["no exec-form ENTRYPOINT: `docker run IMAGE serve` would run `serve` itself"]
    problems: list[str] = []
    if entrypoint[0] != "maze-serve":
        problems.append(f"ENTRYPOINT runs {entrypoint[0]!r}, not maze-serve")
    exposed = {
        p.split("/")[0] for i, v in stages[-1].instructions if i == "EXPOSE" for p in v.split()
    }
    if exposed != {str(SAGEMAKER_PORT)}:
        problems.append(f"EXPOSE {sorted(exposed)}, SageMaker talks to {SAGEMAKER_PORT}")
    monkeypatch.setenv("SM_MODEL_DIR", str(tmp_path))
    monkeypatch.setenv("MAZE_CACHE_DIR", str(tmp_path / "cache"))
    for args in (argv[1:], [*entrypoint[1:], "serve"]):
        try:
            serve_cli.build_parser().parse_args(args)
            settings = serve_cli.resolve(args)
        except (SystemExit, serve_cli.UsageError) as exc:
            problems.append(f"maze-serve rejects {args} ({exc})")
            continue
        if (settings.host, settings.port) != ("0.0.0.0", SAGEMAKER_PORT):
            problems.append(f"maze-serve {args} binds {settings.host}:{settings.port}")
        if settings.args.command != "serve":
            problems.append(f"maze-serve {args} is not the SageMaker mode")
    for i, v in stages[-1].instructions:
        if i == "HEALTHCHECK" and not re.search(rf"https?://[\w.]+:{SAGEMAKER_PORT}/ping\b", v):
            problems.append("HEALTHCHECK does not ask /ping on the served port")
    return problems


# --- tests ----------------------------------------------------------------------------------


def test_both_images_exist() -> None:
    assert {p.name for p in DOCKERFILES} >= {"train.Dockerfile", "serve.Dockerfile"}
    for path in DOCKERFILES:
        assert "Build context: the repository root" in path.read_text(), path.name


@pytest.mark.parametrize("path", DOCKERFILES, ids=[p.name for p in DOCKERFILES])
def test_dockerfile(path: Path) -> None:
    assert check(path) == []


def test_serve_image_starts_maze_serve_for_sagemaker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert serve_problems(IMAGES / "serve.Dockerfile", monkeypatch, tmp_path) == []


def test_the_endpoint_env_is_what_the_serve_image_reads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``maze-infra endpoint deploy`` sets the container env; the image's command reads it."""
    spec = EndpointSpec(
        name="mazerl",
        image="123456789012.dkr.ecr.us-east-1.amazonaws.com/mazerl-serve:1",
        adapter="s3://mazerl-models/adapters/run1/",
        base_model="s3://mazerl-models/base/qwen3-vl-8b/",
        role="arn:aws:iam::123456789012:role/sm",
    )
    argv, _ = image_argv(parse(IMAGES / "serve.Dockerfile"))
    assert argv is not None
    for key in ("MAZE_MODEL", "MAZE_ADAPTER", "MAZE_BASE_MODEL", "SM_MODEL_DIR"):
        monkeypatch.delenv(key, raising=False)
    for key, value in spec.container_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MAZE_CACHE_DIR", str(tmp_path))
    settings = serve_cli.resolve(argv[1:])
    assert settings.model_path == spec.base_model
    assert settings.adapters == {"adapter": spec.adapter} and settings.default_adapter == "adapter"


def test_what_each_image_installs() -> None:
    train, serve = closure("maze-trainer"), closure("maze-server")
    # The Ray job's entrypoint runs maze-train in the Ray head pod: `ray` comes with it.
    assert {"ray", "skyrl", "torch", "maze-engine"} <= train
    # The README's promise: the serving image holds neither SkyRL nor Ray.
    assert not {"ray", "skyrl", "vllm"} & serve and "maze-serving" in serve


def test_dockerignore_matches_like_docker() -> None:
    assert ignored(".git/config") and ignored("packages/maze-env/tests/test_x.py")
    assert ignored("packages/maze-env/src/maze_env/__pycache__/a.pyc") and ignored("runs/x")
    assert not ignored("packages/maze-env/src/maze_env/__init__.py")
    assert not ignored("uv.lock") and not ignored("infra/images/skyrl-fsdp-overrides.txt")


# Each altered Dockerfile must be rejected by the same checker, for the reason given.
SERVE = (IMAGES / "serve.Dockerfile").read_text()
TRAIN = (IMAGES / "train.Dockerfile").read_text()
BROKEN = [
    (
        "missing-copy",
        SERVE.replace("COPY apps/ apps/", "COPY apps/ apps/\nCOPY models/ /opt/ml/model/"),
        "COPY models/: no such path",
    ),
    (
        "ignored-copy",
        SERVE.replace("COPY apps/ apps/", "COPY apps/ apps/\nCOPY tests/ tests/"),
        "excluded by .dockerignore",
    ),
    (
        "unknown-entrypoint",
        SERVE.replace('ENTRYPOINT ["maze-serve"]', 'ENTRYPOINT ["maze-server"]'),
        "runs 'maze-server': not a workspace",
    ),
    (
        "shell-entrypoint",
        SERVE.replace('ENTRYPOINT ["maze-serve"]', "ENTRYPOINT maze-serve"),
        "shell form",
    ),
    (
        "script-not-installed",
        SERVE.replace('ENTRYPOINT ["maze-serve"]', 'ENTRYPOINT ["maze-train"]'),
        "which no `uv sync --package` installs",
    ),
    ("unlocked-sync", SERVE.replace("uv sync --frozen", "uv sync"), "does not use the lock"),
    ("dev-tools", SERVE.replace(" --no-dev", ""), "no --no-dev"),
    (
        "wrong-python",
        SERVE.replace("python:3.12-slim", "python:3.11-slim"),
        "installs Python ['3.11']",
    ),
    (
        "no-venv-on-path",
        SERVE.replace("PATH=/opt/venv/bin:$PATH", "PATH=/usr/bin"),
        "lacks the venv's bin",
    ),
    (
        "unpinned-layer",
        TRAIN.replace('"skyrl[fsdp]==${SKYRL_VERSION}"', "skyrl[fsdp]"),
        "not pinned",
    ),
    (
        "override-not-copied",
        TRAIN.replace("--override /tmp/skyrl-fsdp-overrides.txt", "--override /tmp/other.txt"),
        "not a file the Dockerfile copies in",
    ),
    (
        "pip-install",
        TRAIN.replace(
            "uv pip install --python /opt/venv/bin/python \\\n        torch",
            "pip install \\\n        torch",
        ),
        "install through uv",
    ),
]


@pytest.mark.parametrize(
    ("text", "reason"), [(t, r) for _, t, r in BROKEN], ids=[n for n, _, _ in BROKEN]
)
def test_the_checker_rejects(text: str, reason: str, tmp_path: Path) -> None:
    path = tmp_path / "altered.Dockerfile"
    path.write_text(text)
    assert text not in (SERVE, TRAIN)  # the alteration took
    problems = check(path)
    assert any(reason in p for p in problems), problems


def test_override_pins_must_be_the_locked_versions(tmp_path: Path) -> None:
    overrides = tmp_path / "overrides.txt"
    overrides.write_text("ray[default]==2.57.0\nxgrammar==0.2.3\n")
    problems = override_problems(overrides)
    assert problems == [f"overrides.txt: ray==2.57.0, but uv.lock has {lock()['ray']['version']}"]
    assert override_problems(IMAGES / "skyrl-fsdp-overrides.txt") == []


@pytest.mark.parametrize(
    ("cmd", "reason"),
    [
        ('CMD ["serve", "--listen", "8080"]', "maze-serve rejects"),  # a flag maze-serve lacks
        ('CMD ["serve", "--port", "8000"]', "binds 0.0.0.0:8000"),
        ("CMD []", "maze-serve rejects [] (--model is required"),  # `docker run IMAGE`
    ],
)
def test_the_serve_check_rejects(
    cmd: str, reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "serve.Dockerfile"
    path.write_text(SERVE.replace('CMD ["serve"]', cmd))
    problems = serve_problems(path, monkeypatch, tmp_path)
    assert any(reason in p for p in problems), problems


def test_the_serve_check_wants_port_8080(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "serve.Dockerfile"
    path.write_text(SERVE.replace("EXPOSE 8080", "EXPOSE 8000"))
    assert serve_problems(path, monkeypatch, tmp_path) == [
        f"EXPOSE ['8000'], SageMaker talks to {SAGEMAKER_PORT}"
    ]


def test_whitelisted_binaries_have_reasons() -> None:
    assert all(len(reason) > 20 for reason in SYSTEM_BINARIES.values())
    assert not set(SYSTEM_BINARIES) & set(workspace_scripts())
