"""The house rules of CONTRIBUTING.md that a machine can check, over every file in src/:
functions at most 80 lines, modules at most 600, no issue numbers, and every page of the docs
a docstring or comment cites exists; and no issue numbers in bench/ either."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "sendqueue"
BENCH = ROOT / "bench"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600

#: "issue 14", "Issues 13 and 14": an issue named with its number, in any text file.
_ISSUE_WORD = re.compile(r"\b[Ii]ssues?\s+#?\d+")
#: "(#17)", "see #3": a bare issue number, outside stylesheets and images (colours there).
_ISSUE_HASH = re.compile(r"(?:(?<=\s)|(?<=\())#\d+\b")
_COLOUR_FILES = {".css", ".svg"}
_TEXT_FILES = {".py", ".html", ".js", ".css", ".svg", ".mako", ".txt", ".sql"}
#: A page of the docs as the code cites it: "docs/performance.md", "setup.md".
_DOC = re.compile(r"(?<![\w/.-])((?:docs/)?(?:decisions/)?[\w.-]+\.md)\b")


def long_functions(path: Path) -> list[tuple[int, str, int]]:
    """Every function of ``path`` longer than the limit, counted from its ``def`` line
    through its last line (docstring included): ``(line, name, lines)``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found.append((node.lineno, node.name, lines))
    return found


def issue_lines(path: Path) -> list[int]:
    """The numbers of the lines of ``path`` that cite an issue by its number."""
    colours = path.suffix in _COLOUR_FILES
    return [
        n
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _ISSUE_WORD.search(line) or (not colours and _ISSUE_HASH.search(line))
    ]


def missing_docs(path: Path) -> list[tuple[int, str]]:
    """The pages of the docs that ``path`` cites and that do not exist: ``(line, name)``."""
    found = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for name in _DOC.findall(line):
            page = name.removeprefix("docs/")
            if not ((ROOT / "docs" / page).is_file() or (ROOT / page).is_file()):
                found.append((n, name))
    return found


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    body = "    x = 1\n"
    code = tmp_path / "code.py"
    code.write_text(
        "def longest_allowed() -> None:\n"
        + body * (MAX_FUNCTION_LINES - 1)
        + "\n\nclass C:\n    async def too_long(self) -> None:\n"
        + ("    " + body) * MAX_FUNCTION_LINES
    )
    assert long_functions(code) == [(MAX_FUNCTION_LINES + 4, "too_long", MAX_FUNCTION_LINES + 1)]

    cited = tmp_path / "cited.py"
    cited.write_text(
        '"""Why (issue 16)."""\n'
        "# see (#17) and #3\n"
        "X = '&#34; key#1 [#0] color:#666666'\n"
        "# Issues 13 and 14\n"
        "# design.md, docs/performance.md, docs/nowhere.md\n"
    )
    assert issue_lines(cited) == [1, 2, 4]
    assert missing_docs(cited) == [(5, "design.md"), (5, "docs/nowhere.md")]
    style = tmp_path / "style.css"
    style.write_text(":root { --bg: #111418; --x: #666; }\n/* issue 3 */\n")
    assert issue_lines(style) == [2]


def test_no_function_is_longer_than_80_lines() -> None:
    found = [
        f"{_where(path)}:{line} {name} ({lines} lines)"
        for path in _modules()
        for line, name, lines in long_functions(path)
    ]
    assert not found, "split each into helpers that read as its steps:\n" + "\n".join(found)


def test_no_module_is_longer_than_600_lines() -> None:
    found = [
        f"{_where(path)} ({n} lines)"
        for path in _modules()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    ]
    assert not found, "make two modules of each:\n" + "\n".join(found)


def _text_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in _TEXT_FILES)


def test_no_issue_numbers_in_src() -> None:
    files = _text_files(SRC)
    found = [f"{_where(path)}:{n}" for path in files for n in issue_lines(path)]
    assert not found, "say what the code does and why, not which issue:\n" + "\n".join(found)


def test_no_issue_numbers_in_bench() -> None:
    files = _text_files(BENCH)
    assert any(path.name == "__main__.py" for path in files)  # the scan reaches the benches
    found = [f"{_where(path)}:{n}" for path in files for n in issue_lines(path)]
    assert not found, "say what the bench measures and why, not which issue:\n" + "\n".join(found)


def test_every_cited_page_of_the_docs_exists() -> None:
    found = [f"{_where(path)}:{n}: {name}" for path in _modules() for n, name in missing_docs(path)]
    assert not found, "these pages do not exist:\n" + "\n".join(found)
