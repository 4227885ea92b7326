"""``iq --help`` and every command's help (issue 27, point 14): a plain flag shows no
``<bool>``, and help texts reflow to the terminal (docstrings' line breaks never break a
sentence), in the command lists and on each command's page."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from iqbridge.cli import app
from iqbridge.cli.helptext import reflow

WIDE = 250


def _commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for name, cmd in sorted(group.commands.items()):
        yield (*path, name), cmd
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, (*path, name))


TREE = list(_commands(typer.main.get_command(app)))


def _help(path: tuple[str, ...], width: int) -> str:
    out = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(width)})
    assert out.exit_code == 0, out.output
    return out.stdout


def _lines(text: str) -> list[str]:
    """Each line's text inside the help panels' borders, spaces collapsed."""
    return [" ".join(ln.strip(" │╭╮╰╯─").split()) for ln in text.splitlines()]


def test_the_tree_is_walked() -> None:
    names = {" ".join(p) for p, _ in TREE}
    assert {"put", "unsubscribe", "recover", "bridge run", "journal export"} <= names


@pytest.mark.parametrize("path", [(), *(p for p, _ in TREE)], ids=lambda p: " ".join(p) or "iq")
def test_flags_show_no_type_and_paragraphs_are_not_broken(path: tuple[str, ...]) -> None:
    for width in (80, WIDE):
        text = _help(path, width)
        assert "<bool>" not in text, text
    lines = _lines(text)
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    # Each paragraph of the command's own help on one line, as the terminal wraps it.
    for para in (reflow(cmd.help) or "").split("\n\n"):
        if "\n" in para or len(para) > WIDE - 10:
            continue  # a list or an example keeps its lines; too long to fit one line
        assert " ".join(para.split()) in lines, (para, text)


GROUPS = [(), *(p for p, c in TREE if hasattr(c, "commands"))]


@pytest.mark.parametrize("group", GROUPS, ids=lambda p: " ".join(p) or "iq")
def test_command_lists_show_each_summary_unbroken(group: tuple[str, ...]) -> None:
    lines = _lines(_help(group, WIDE))
    for path, cmd in TREE:
        if path[:-1] != group or not cmd.help:
            continue
        summary = " ".join((reflow(cmd.help) or "").split("\n\n")[0].split())
        assert any(ln.startswith(path[-1]) and ln.endswith(summary) for ln in lines), summary
