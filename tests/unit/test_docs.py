"""The documentation is tested, so it cannot rot.

Every ```python block of README.md, docs/*.md and docs/adapters/*.md runs: each file's
blocks in order, in one namespace, in a temporary working directory (SQLite files land
there). A block that is deliberately not runnable is marked by the HTML comment
``<!-- not-tested -->`` on the line before it. A ```text block marked by
``<!-- expected-output -->`` must equal what the python block just before it printed.
Relative links between the documents must point at files that exist.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(
    [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "docs" / "adapters").glob("*.md")]
)

NOT_TESTED = "<!-- not-tested -->"
EXPECTED = "<!-- expected-output -->"
_FENCE = re.compile(r"^```(\w*)\s*$")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced code block: its language, first code line, code, and the marker before it."""

    lang: str
    line: int
    code: str
    marker: str | None


def blocks(text: str) -> list[Block]:
    """Every fenced block of a Markdown text, in order."""
    out: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        prev = lines[j].strip() if j >= 0 else ""
        marker = prev if prev in (NOT_TESTED, EXPECTED) else None
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        if end == len(lines):
            raise AssertionError(f"unclosed code fence at line {i + 1}")
        out.append(Block(m.group(1), i + 2, "\n".join(lines[i + 1 : end]) + "\n", marker))
        i = end + 1
    return out


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_python_blocks_run(doc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each file's python blocks run in order in one namespace; printed output matches."""
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs:{doc.name}"}
    printed: str | None = None
    for block in blocks(doc.read_text(encoding="utf-8")):
        where = f"{_rel(doc)}:{block.line}"
        if block.marker == EXPECTED:
            assert printed is not None, f"{where}: expected output follows no python block"
            assert _lines(printed) == _lines(block.code), (
                f"{where}: the python block before this one printed something else:\n{printed}"
            )
            printed = None
            continue
        if block.lang != "python" or block.marker == NOT_TESTED:
            printed = None
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block.code, where, "exec"), namespace)
        printed = out.getvalue()


def test_readme_has_the_two_commands_and_code() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "./scripts/demo" in text
    assert "./scripts/test" in text
    runnable = [b for b in blocks(text) if b.lang == "python" and b.marker != NOT_TESTED]
    assert runnable, "README.md has no runnable python example"


def test_not_tested_blocks_are_rare() -> None:
    total = skipped = 0
    for doc in DOCS:
        for b in blocks(doc.read_text(encoding="utf-8")):
            if b.lang == "python":
                total += 1
                skipped += b.marker == NOT_TESTED
    assert total > 0
    assert skipped * 5 <= total, f"{skipped} of {total} python blocks are not tested"


def anchors(text: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown text."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    out = set()
    for heading in re.findall(r"^#+ +(.+?) *$", prose, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
        out.add(slug.replace(" ", "-"))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_relative_links_resolve(doc: Path) -> None:
    """Links to other files point at files that exist, and #anchors at real headings."""
    text = doc.read_text(encoding="utf-8")
    # Links inside code blocks are code, not links.
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    broken = []
    for target in _LINK.findall(prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path) if path else doc
        missing = not file.exists()
        if not missing and anchor and file.suffix == ".md":
            missing = anchor not in anchors(file.read_text(encoding="utf-8"))
        if missing:
            broken.append(target)
    assert not broken, f"{_rel(doc)} has broken links: {broken}"


def test_block_parser_reads_markers() -> None:
    text = "\n".join(
        [
            "intro",
            NOT_TESTED,
            "```python",
            "raise SystemExit",
            "```",
            "",
            "```python",
            "print(1)",
            "```",
            EXPECTED,
            "```text",
            "1",
            "```",
        ]
    )
    found = blocks(text)
    assert [(b.lang, b.marker, b.line) for b in found] == [
        ("python", NOT_TESTED, 4),
        ("python", None, 8),
        ("text", EXPECTED, 12),
    ]
    assert found[1].code == "print(1)\n"


def test_example_adapter_passes_the_contract_suite(tmp_path: Path) -> None:
    """The toy adapter of docs/adding-an-adapter.md passes the whole shared suite, as the
    guide says: the guide's own contract subclass runs in a separate pytest process."""
    code = [
        b.code
        for b in blocks((ROOT / "docs" / "adding-an-adapter.md").read_text(encoding="utf-8"))
        if b.lang == "python"
        and ("class DirectoryAdapter" in b.code or "class TestDirectoryAdapter" in b.code)
    ]
    assert len(code) == 2, "the guide should define DirectoryAdapter and its contract test"
    (tmp_path / "test_directory_contract.py").write_text("import iqbridge\n" + "\n".join(code))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-x",
            "test_directory_contract.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failed" not in run.stdout
