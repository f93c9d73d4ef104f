"""The engine's shape (issue 18): federation/protocol imports no I/O, no part imports the node, and no module
imports another in a circle (type-only imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

PROTOCOL = Path(__file__).resolve().parents[2] / "federation" / "protocol"
PACKAGE = "federation.protocol"
FORBIDDEN = {"socket", "asyncio", "threading", "time", "paho"}
"""what the sans-I/O engine never imports: time comes in as an argument, I/O is the embedder's"""


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (under TYPE_CHECKING and in functions too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            found.add(node.module)
            if node.module == PACKAGE:  # `from federation.protocol import wire`
                found.update(f"{PACKAGE}.{alias.name}" for alias in node.names)
    return found


def graph() -> dict[str, set[str]]:
    modules = {f"{PACKAGE}.{path.stem}": path for path in PROTOCOL.glob("*.py") if path.stem != "__init__"}
    return {name: {m for m in imports_of(path) if m in modules} for name, path in modules.items()}


def test_the_engine_imports_no_io() -> None:
    offenders = {path.name: sorted(m for m in imports_of(path) if m.split(".")[0] in FORBIDDEN)
                 for path in PROTOCOL.glob("*.py")}
    assert not {name: found for name, found in offenders.items() if found}


def test_no_part_imports_the_node() -> None:
    assert sorted(name for name, imported in graph().items() if f"{PACKAGE}.node" in imported) == []


def test_no_import_circle() -> None:
    edges = graph()
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import circle: " + " -> ".join(path[path.index(name):] + [name]))
        if name in done:
            return
        for imported in sorted(edges[name]):
            visit(imported, path + [name])
        done.add(name)

    for name in sorted(edges):
        visit(name, [])
