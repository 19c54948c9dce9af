"""Import boundaries and the house's rooms: arq lives behind agent_async/engine/, the library never
imports Quart, collaborators never receive the Agent, modules stay small, Lua files say their keys."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "agent_async"
ENGINE = LIBRARY / "engine"

# arq's key names and vocabulary: only the engine package may spell them.
ARQ_WORDS = ("arq:", "in-progress", "in_progress_key_prefix", "job_key_prefix", "result_key_prefix")
# The modules that may hold an Agent: the composition root, its facade, the public API, the entry
# points (the library's CLI, the test helpers).
AGENT_HOLDERS = {
    "agent_async/__init__.py", "agent_async/__main__.py", "agent_async/agent.py", "agent_async/client.py",
    "agent_async/testing.py",
}


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


def string_constants(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_only_the_engine_package_imports_arq() -> None:
    importers = importers_of("arq", "agent_async", "app")
    assert importers, "the engine imports arq"
    assert all(path.startswith("agent_async/engine/") for path in importers), importers


def test_no_library_module_outside_the_engine_spells_arqs_keys() -> None:
    offenders = []
    for path in sorted(LIBRARY.rglob("*.py")):
        if ENGINE in path.parents:
            continue
        for text in string_constants(path):
            offenders += [f"{path.relative_to(ROOT)}: {word!r}" for word in ARQ_WORDS if word in text]
    for path in sorted(LIBRARY.rglob("*.lua")):
        if ENGINE in path.parents:
            continue
        code = "\n".join(line.split("--", 1)[0] for line in path.read_text().splitlines())
        offenders += [f"{path.relative_to(ROOT)}: {word!r}" for word in ARQ_WORDS if word in code]
    assert offenders == []


def test_library_never_imports_quart() -> None:
    assert importers_of("quart", "agent_async") == []
    assert importers_of("quart_schema", "agent_async") == []


def test_no_collaborator_imports_the_agent() -> None:
    """Collaborators get the few things they use in their constructors, never the whole Agent."""
    importers = set(importers_of("agent_async.agent", "agent_async"))
    assert importers <= AGENT_HOLDERS, sorted(importers - AGENT_HOLDERS)


def test_modules_stay_small_and_agent_is_a_composition_root() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in LIBRARY.rglob("*.py")}
    assert {path: n for path, n in sizes.items() if n > 400} == {}
    assert sizes["agent_async/agent.py"] < 250


def test_every_lua_file_names_its_keys_and_arguments() -> None:
    lua_files = sorted(LIBRARY.rglob("lua/*.lua"))
    assert len(lua_files) >= 8
    for path in lua_files:
        header = path.read_text().split("\n\n", 1)[0]
        assert header.startswith("--"), f"{path.name}: no header comment"
        if not path.name.endswith("lib.lua") and path.name != "queue.lua":  # libraries of functions, not scripts
            assert "KEYS:" in header and "ARGV:" in header, f"{path.name}: the header must name KEYS and ARGV"
