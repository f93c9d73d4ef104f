"""Read the tables of a Markdown document, so tests can compare what the docs say with the code.

A table is found by the heading it sits under; its rows become dicts keyed by the header's cells. Cells
name things in backticks; `names` splits a cell into the names it lists, with `[`bracketed`]` ones
optional and (parenthesised remarks) ignored.
"""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"

_HEADING = re.compile(r"^(#+)\s+(.*?)\s*$")
_NAME = re.compile(r"`([^`]+)`")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def table(document: str, heading: str) -> list[dict[str, str]]:
    """The rows of the first table under `heading` (a heading's exact text) in docs/<document>."""
    lines = (DOCS / document).read_text(encoding="utf-8").splitlines()
    level = None
    for number, line in enumerate(lines):
        match = _HEADING.match(line)
        if match and match.group(2) == heading:
            level = len(match.group(1))
            start = number + 1
            break
    if level is None:
        raise AssertionError(f"docs/{document} has no heading {heading!r}")
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in lines[start:]:
        match = _HEADING.match(line)
        if match and len(match.group(1)) <= level:
            break
        if not line.startswith("|"):
            if header is not None:
                break  # the table ended
            continue
        cells = _cells(line)
        if header is None:
            header = cells
        elif not all(set(cell) <= set("-: ") for cell in cells):
            rows.append(dict(zip(header, cells, strict=True)))
    if not rows:
        raise AssertionError(f"docs/{document}, {heading!r}: no table rows")
    return rows


def backticked(cell: str) -> list[str]:
    return _NAME.findall(cell)


def names(cell: str) -> tuple[list[str], list[str]]:
    """(names always there, names in [brackets]) of a cell, ignoring what is in (parentheses)."""
    depth, kept = 0, []
    for character in cell:
        if character == "(":
            depth += 1
        elif character == ")":
            depth = max(0, depth - 1)
        elif depth == 0:
            kept.append(character)
    text = "".join(kept)
    optional = [name for group in re.findall(r"\[([^\]]*)\]", text) for name in backticked(group)]
    required = backticked(re.sub(r"\[[^\]]*\]", "", text))
    return required, optional
