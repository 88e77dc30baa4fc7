"""Every console script: --help works, every option and argument of every subcommand has help
text without RST markup, and a bad flag is an error that speaks as the command."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from pathlib import Path

import pytest

SCRIPTS = (
    "maze-env",
    "maze-verifier",
    "weight-sync",
    "lora-consolidate",
    "maze-train",
    "maze-eval",
    "maze-serve",
    "maze-infra",
)
RST = re.compile(r"``|:(?:func|class|mod|meth|attr|data|exc):`|^\s*\.\. ", re.M)


class _Parsed(Exception):  # noqa: N818 - a control-flow signal, not an error
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def _entry(script: str) -> Callable[[list[str]], int]:
    (ep,) = entry_points(group="console_scripts", name=script)
    return ep.load()


def _parser(
    script: str, argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> argparse.ArgumentParser:
    """The parser ``script``'s main builds for ``argv``, caught as it starts parsing."""

    def grab(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Parsed(self)

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_known_args", grab)
        if script == "maze-train":  # it reconfigures SkyRL's loguru before parsing
            m.setattr("maze_trainer.cli._quiet_skyrl_logs", lambda: None)
        try:
            _entry(script)(argv)
        except _Parsed as caught:
            return caught.parser
    raise AssertionError(f"{script} {argv} never parsed its arguments")


def _walk(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():  # pyright: ignore[reportUnknownVariableType]
                yield from _walk(sub)  # pyright: ignore[reportUnknownArgumentType]


def _dispatched(script: str, parser: argparse.ArgumentParser) -> list[str]:
    """Subcommands routed to their own parser before argparse runs (maze-train's warm-start,
    plot, ...): the usage lists them as ``SCRIPT NAME ...``."""
    return re.findall(
        rf"^\s*(?:usage: )?{re.escape(script)} ([a-z][a-z-]*)", parser.format_usage(), re.M
    )


def _parsers(script: str, monkeypatch: pytest.MonkeyPatch) -> list[argparse.ArgumentParser]:
    top = [_parser(script, [], monkeypatch)]
    top += [_parser(script, [sub], monkeypatch) for sub in _dispatched(script, top[0])]
    return [p for t in top for p in _walk(t)]


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_option_of_every_subcommand_has_help(
    script: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsers = _parsers(script, monkeypatch)
    missing: list[str] = []
    for p in parsers:
        assert p.prog.startswith(script), p.prog  # usage and errors name the command run
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                continue
            if not a.help or a.help == argparse.SUPPRESS:
                missing.append(f"{p.prog} {'/'.join(a.option_strings) or a.dest}")
        text = p.format_help()
        assert not RST.search(text), f"{p.prog} --help shows RST markup: {RST.search(text)}"
    assert not missing, "options without help: " + ", ".join(missing)
    if script == "maze-train":
        assert {"maze-train warm-start", "maze-train plot"} <= {p.prog for p in parsers}


def _bin(script: str) -> str:
    return str(Path(sys.executable).parent / script)


@pytest.mark.parametrize("script", SCRIPTS)
def test_console_script_help_and_a_bad_flag(
    script: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = subprocess.run(
        [_bin(script), "--help"], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: {script}") and not proc.stderr
    if script == "maze-train":
        monkeypatch.setattr("maze_trainer.cli._quiet_skyrl_logs", lambda: None)
    try:
        code = _entry(script)(["--no-such-flag"])
    except SystemExit as exc:  # argparse's own usage error
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"{script}: ")


def test_maze_train_usage_shows_the_overrides() -> None:
    usage = subprocess.run(
        [_bin("maze-train"), "--help"], capture_output=True, text=True, timeout=300, check=True
    ).stdout.split("\n\n")[0]
    assert "[key=value ...]" in usage.splitlines()[0]
    assert "maze-train plot RUN_DIR" in usage
