"""Docs in layers (issue 77): a module's docstring says what and why in at most 20 lines, and
the full statement it points to ("In full: docs/X.md, "Section"") exists.

Only module docstrings count: a rule's own docstring (What / Why / Fix) is its documentation
and may be as long as it needs. Lines are counted from the opening to the closing quotes.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MAX_LINES = 20
# `In full: docs/analyses.md, "Clock offsets".` (in a docstring or a comment, maybe wrapped).
POINTER = re.compile(r'In full[^:\n]*:\s*docs/([\w.-]+\.md)(?:,\s*"([^"]+)")?')


def _sources() -> list[Path]:
    return sorted([*(ROOT / "kineto_comm").rglob("*.py"), *(ROOT / "rules").glob("*.py")])


def docstring_lines(source: str) -> int:
    """Lines the module docstring spans, quotes included (0 without one)."""
    body = ast.parse(source).body
    if not body or not isinstance(body[0], ast.Expr):
        return 0
    node = body[0]
    if not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
        return 0
    return (node.end_lineno or node.lineno) - node.lineno + 1


def pointers(source: str) -> list[tuple[str, str | None]]:
    """The (doc, section) pairs of every "In full:" pointer, comments' `#` and wrapping undone."""
    text = re.sub(r"\n[ \t]*#[ \t]?", "\n", source)
    return [
        (doc, re.sub(r"\s+", " ", section) if section else None)
        for doc, section in POINTER.findall(text)
    ]


def _titles(doc: Path) -> list[str]:
    """A doc's headings and its bold table names (`**kernels**`), the places a pointer may name."""
    text = doc.read_text(encoding="utf-8")
    headings = re.findall(r"^#+ (.+)$", text, flags=re.M)
    return headings + re.findall(r"\*\*([^*]+)\*\*", text)


def test_the_checks_see_what_they_check() -> None:
    long = '"""What.\n' + "more\n" * 25 + '"""\n\nX = 1\n'
    assert docstring_lines(long) == 27
    assert docstring_lines('"""One line."""\n') == 1
    assert docstring_lines("X = 1\n") == 0
    wrapped = '# Rows.\n# In full: docs/analyses.md, "Clock\n# offsets".\n'
    assert pointers(wrapped) == [("analyses.md", "Clock offsets")]
    assert pointers('"""What. In full:\ndocs/scale.md."""') == [("scale.md", None)]


def test_module_docstrings_fit_a_screen() -> None:
    long = {}
    for path in _sources():
        n = docstring_lines(path.read_text(encoding="utf-8"))
        if n > MAX_LINES:
            long[str(path.relative_to(ROOT))] = n
    assert not long, f"module docstrings over {MAX_LINES} lines (move the rest to docs/): {long}"


def test_every_in_full_pointer_names_a_doc_and_section() -> None:
    seen = 0
    broken = []
    for path in _sources():
        for doc, section in pointers(path.read_text(encoding="utf-8")):
            seen += 1
            where = f"{path.relative_to(ROOT)} -> docs/{doc}"
            if not (DOCS / doc).is_file():
                broken.append(f"{where}: no such doc")
            elif section and not any(t.startswith(section) for t in _titles(DOCS / doc)):
                broken.append(f'{where}: no heading "{section}"')
    assert seen >= 10, "the pointers the modules write were not found"
    assert not broken, broken
