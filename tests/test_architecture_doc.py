"""docs/architecture.md's module map has one line per module of `keraunos/`, from its docstring.

The map is a table `| keraunos/ledger/sqlite.py | <first line of the module's docstring> |`, in
path order. When modules are added, moved or re-described, the test says which lines to add and
which to remove; `python tests/test_architecture_doc.py` prints the whole map as it should be, and
`python tests/test_architecture_doc.py --write` puts it into docs/architecture.md. The modules the
document names elsewhere (the path of a model call) must exist too.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "keraunos"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

MAP_HEADING = "## Module map"
TABLE_HEAD = "| module | what it is (the first line of its docstring) |\n|---|---|\n"
#: A row of the map: `| keraunos/x/y.py | text |` (a `|` inside the text is written `\|`).
_ROW = re.compile(r"^\| (keraunos/\S+\.py) \| (.*) \|$")
#: A module path named anywhere in the document, e.g. `keraunos/gateway/proxy/routes.py`.
_MODULE_PATH = re.compile(r"keraunos/[\w/]+\.py")


def first_docstring_line(path: Path) -> str:
    """The first line of the module docstring of `path`, or a note that it has none."""
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=True)
    if not docstring or not docstring.strip():
        return "(no docstring: write one that says what this module is for)"
    return docstring.strip().splitlines()[0].strip()


def expected_rows() -> list[str]:
    """The map's rows as the modules under keraunos/ make them, in path order."""
    rows: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py"), key=lambda p: p.relative_to(ROOT).as_posix()):
        if "__pycache__" in path.parts:
            continue
        line = first_docstring_line(path).replace("|", "\\|")
        rows.append(f"| {path.relative_to(ROOT).as_posix()} | {line} |")
    return rows


def documented_rows(markdown: str) -> list[str]:
    """The rows of the module map in `markdown`, in their order."""
    return [line for line in _map_section(markdown).splitlines() if _ROW.match(line)]


def _map_section(markdown: str) -> str:
    start = markdown.find(f"\n{MAP_HEADING}\n")
    if start < 0:
        return ""
    end = markdown.find("\n## ", start + len(MAP_HEADING) + 2)
    return markdown[start : end if end >= 0 else len(markdown)]


def with_map(markdown: str, rows: list[str]) -> str:
    """`markdown` with its module map table replaced by `rows` (the text around the table stays)."""
    section = _map_section(markdown)
    if not section:
        raise SystemExit(f"{ARCHITECTURE} has no '{MAP_HEADING}' section to write the map into")
    lines = section.split("\n")
    table = [i for i, line in enumerate(lines) if line.startswith("|")]
    table_text = TABLE_HEAD + "\n".join(rows)
    if table:
        first, last = table[0], table[-1]
        new_lines = [*lines[:first], table_text, *lines[last + 1 :]]
    else:
        new_lines = [*lines, "", table_text, ""]
    return markdown.replace(section, "\n".join(new_lines), 1)


def test_the_module_map_has_one_line_per_module_with_its_first_docstring_line() -> None:
    expected = expected_rows()
    documented = documented_rows(ARCHITECTURE.read_text(encoding="utf-8"))
    missing = [row for row in expected if row not in documented]
    stale = [row for row in documented if row not in expected]
    problems: list[str] = []
    if missing:
        problems.append("add these lines to the module map:\n  " + "\n  ".join(missing))
    if stale:
        problems.append("remove these lines from the module map:\n  " + "\n  ".join(stale))
    if not problems and documented != expected:
        problems.append("the module map's lines are not in path order")
    assert not problems, (
        "docs/architecture.md's module map is out of date "
        "(`python tests/test_architecture_doc.py --write` rewrites it):\n" + "\n".join(problems)
    )


def test_every_module_the_architecture_names_exists() -> None:
    markdown = ARCHITECTURE.read_text(encoding="utf-8")
    outside_map = markdown.replace(_map_section(markdown), "")
    named = sorted(set(_MODULE_PATH.findall(outside_map)))
    absent = [path for path in named if not (ROOT / path).is_file()]
    assert named, "docs/architecture.md names no module outside its map"
    assert not absent, "docs/architecture.md names modules that do not exist (moved?):\n  " + "\n  ".join(
        absent
    )


def test_a_module_added_without_a_line_is_reported_as_a_line_to_add() -> None:
    rows = expected_rows()
    markdown = with_map(ARCHITECTURE.read_text(encoding="utf-8"), rows[1:])
    missing = [row for row in rows if row not in documented_rows(markdown)]
    assert missing == [rows[0]]


def test_writing_the_map_keeps_the_rest_of_the_document() -> None:
    markdown = "# A\n\ntext\n\n## Module map\n\nintro\n\n| module | x |\n|---|---|\n| keraunos/a.py | old |\n\nafter\n\n## Next\n\nmore\n"
    written = with_map(markdown, ["| keraunos/b.py | new |"])
    assert documented_rows(written) == ["| keraunos/b.py | new |"]
    assert written.startswith("# A\n\ntext\n\n## Module map\n\nintro\n\n| module |")
    assert written.endswith("| keraunos/b.py | new |\n\nafter\n\n## Next\n\nmore\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        ARCHITECTURE.write_text(with_map(ARCHITECTURE.read_text(encoding="utf-8"), expected_rows()))
        print(f"wrote the module map of {len(expected_rows())} modules into {ARCHITECTURE}")
    else:
        sys.stdout.write(TABLE_HEAD + "\n".join(expected_rows()) + "\n")
