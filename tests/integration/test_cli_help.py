"""Every command's ``--help`` shows every option name whole (Rich cut them to
``--unsubscribe-fo…`` at its 80 columns): in a real process writing to a pipe (160 columns)
and in one writing to a terminal narrower than the help needs (40 columns: HELP_MIN_WIDTH)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import Any

import typer.main

import sendqueue
from sendqueue.cli import app
from sendqueue.cli.common import HELP_MIN_WIDTH, help_width

SRC = str(Path(sendqueue.__file__).resolve().parents[1])
MARK = "=== sendqueue help of:"
#: Prints the help of every command of the app, each after a line naming it.
WALK = f"""
import sys
import typer.main
from sendqueue.cli import app, main

def walk(command, path):
    yield path
    for name, sub in sorted(getattr(command, "commands", {{}}).items()):
        yield from walk(sub, [*path, name])

for path in walk(typer.main.get_command(app), []):
    print({MARK!r}, " ".join(path), flush=True)
    sys.argv = ["sendqueue", *path, "--help"]
    try:
        main()
    except SystemExit:
        pass
"""
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def option_names() -> dict[str, list[str]]:
    """Every command path (``""`` for the root, ``"campaign create"``) and its options' names."""
    found: dict[str, list[str]] = {}

    def walk(command: Any, path: list[str]) -> None:
        found[" ".join(path)] = [
            name
            for param in command.params
            for name in (*param.opts, *param.secondary_opts)
            if name.startswith("-")
        ]
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"COLUMNS", "LINES", "TERMINAL_WIDTH"}}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))
    env["NO_COLOR"] = "1"
    return env


def sections(text: str) -> dict[str, str]:
    """The help text of each command, by its path."""
    parts = ANSI.sub("", text.replace("\r\n", "\n")).split(MARK)
    return {part.split("\n", 1)[0].strip(): part.split("\n", 1)[1] for part in parts[1:]}


def assert_names_whole(helps: dict[str, str]) -> None:
    expected = option_names()
    assert set(helps) == set(expected)
    assert len(expected) > 30  # the walk reached the command groups' commands
    for path, names in expected.items():
        for name in [*names, "--help"]:
            whole = re.compile(rf"(?<![\w-]){re.escape(name)}(?![\w-]|…)")
            assert whole.search(helps[path]), f"{name} cut in `sendqueue {path} --help`"


def test_help_width_is_the_terminals_and_never_below_the_minimum() -> None:
    assert help_width(200) == 200
    assert help_width(40) == HELP_MIN_WIDTH


def test_piped_help_shows_every_option_name_whole() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WALK],
        env=_env(), capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    helps = sections(done.stdout)
    assert_names_whole(helps)
    # piped: 160 columns, the width the CLI's other output uses when piped
    assert max(len(line) for line in helps["campaign create"].splitlines()) == 160


def test_a_narrow_terminal_gets_every_option_name_whole() -> None:
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 40, 0, 0))
    child = subprocess.Popen(
        [sys.executable, "-c", WALK],
        env=_env(), stdin=secondary, stdout=secondary, stderr=secondary,
    )  # fmt: skip
    os.close(secondary)
    chunks: list[bytes] = []
    try:
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(primary)
        assert child.wait(timeout=120) == 0
    helps = sections(b"".join(chunks).decode())
    assert_names_whole(helps)
    # a terminal: its width, raised to the minimum at which no name is cut
    assert max(len(line) for line in helps["campaign create"].splitlines()) == HELP_MIN_WIDTH
