"""What ``iq --help`` shows, tidied once for the whole command tree before it is parsed.

- Help texts come from docstrings wrapped at 92 columns; the help formatter keeps single
  line breaks, so a sentence would break mid-line in the command lists and the later
  paragraphs. Each paragraph is reflowed into one line (the terminal wraps it); a
  paragraph whose lines are indented or start with ``-`` (a list, an example), or one
  marked ``\\b``, keeps its breaks.
- A plain flag (``--debug``, ``--json``, ``--help``) takes no value, so it shows no type
  (the formatter would print ``<bool>`` beside it).
"""

from __future__ import annotations

from typing import Any

__all__ = ["reflow", "tidy_help"]


def reflow(text: str | None) -> str | None:
    """``text`` with each paragraph's single line breaks turned into spaces."""
    if not text:
        return text
    lines = text.expandtabs().splitlines()
    # Dedent as inspect.cleandoc does: the first line stands apart from the others.
    rest = [ln for ln in lines[1:] if ln.strip()]
    margin = min((len(ln) - len(ln.lstrip()) for ln in rest), default=0)
    lines = [lines[0].strip(), *(ln[margin:].rstrip() for ln in lines[1:])]
    paragraphs: list[list[str]] = [[]]
    for ln in lines:
        if ln:
            paragraphs[-1].append(ln)
        elif paragraphs[-1]:
            paragraphs.append([])
    out = []
    for para in filter(None, paragraphs):
        kept = para[0].startswith("\b") or any(ln[:1] in (" ", "-") for ln in para[1:])
        out.append("\n".join(para) if kept else " ".join(para))
    return "\n\n".join(out)


def tidy_help(command: Any, ctx: Any) -> None:
    """Reflow the help of ``command`` and every command under it, and give their flags
    (the help option included) an empty type; idempotent."""
    if getattr(command, "_iq_tidy", False):
        return
    command._iq_tidy = True
    command.help = reflow(command.help)
    if command.short_help:
        command.short_help = reflow(command.short_help)
    params = list(command.params)
    get_help_option = getattr(command, "get_help_option", None)
    if callable(get_help_option):
        # Created and cached on first use; the names come from the root's settings,
        # which every sub-context inherits.
        help_option = get_help_option(ctx)
        if help_option is not None:
            params.append(help_option)
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        tidy_help(sub, ctx)
