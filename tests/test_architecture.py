"""Import boundaries: arq lives behind Agent; the library never imports Quart."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def importers_of(top_level: str, *packages: str) -> list[str]:
    hits = []
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            if any(m == top_level or m.startswith(top_level + ".") for m in imported_modules(path)):
                hits.append(str(path.relative_to(ROOT)))
    return hits


def test_only_agent_module_imports_arq() -> None:
    assert importers_of("arq", "agent_async", "app") == ["agent_async/agent.py"]


def test_library_never_imports_quart() -> None:
    assert importers_of("quart", "agent_async") == []
    assert importers_of("quart_schema", "agent_async") == []
