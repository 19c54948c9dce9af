"""Packaging: the wheel ships `agent_async` only, and it imports without the app's packages or the SQL drivers.

The wheel is built from a copy of the checkout (so a stale `build/` cannot leak into it and the
checkout gets no build litter), without build isolation and without an index: no network.
"""

from __future__ import annotations

import email.message
import email.parser
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "agent_async"

# Only the reference app (extra `app`) or one SQL server (extras `postgres`, `mysql`) needs these.
NOT_IN_BASE = {"quart", "hypercorn", "quart-schema", "itsdangerous", "icalendar", "asyncpg", "aiomysql", "pymysql"}
# Import names blocked while the library is imported: `app` too, the library never imports it.
BLOCKED_IMPORTS = ("quart", "hypercorn", "quart_schema", "itsdangerous", "icalendar", "asyncpg", "aiomysql",
                   "pymysql", "app")
# Files other than .py that the library needs at run time (or for `alembic revision`).
DATA_PATTERNS = ("py.typed", "*.lua", "*.mako", "*.ini")
# Not part of the copy the wheel is built from: what the build must not depend on or pick up.
IGNORED_AT_ROOT = {".git", ".venv", "build", "dist", "data", ".hypothesis"}
IGNORED_ANYWHERE = shutil.ignore_patterns("__pycache__", "*.egg-info", ".*_cache", "*.db")


def _ignored(folder: str, names: list[str]) -> set[str]:
    at_root = IGNORED_AT_ROOT & set(names) if Path(folder) == ROOT else set()
    return at_root | IGNORED_ANYWHERE(folder, names)


def _name(requirement: str) -> str:
    """The normalised project name of a Requires-Dist value (PEP 503)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match is not None, requirement
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def _checkout_files(*patterns: str) -> set[str]:
    """Paths (wheel-style, from the root) of the library's files in the checkout that match `patterns`."""
    return {
        path.relative_to(ROOT).as_posix()
        for pattern in patterns
        for path in LIBRARY.rglob(pattern)
        if path.is_file() and "__pycache__" not in path.parts
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source") / "agent-async"
    shutil.copytree(ROOT, source, ignore=_ignored)
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(out), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("agent_async-*.whl")
    return built


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(zf.read(name).decode())


def test_wheel_ships_the_library_only(wheel: Path) -> None:
    """Top-level packages are exactly {agent_async}: no `app` colliding with a user's own package."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        declared = set(zf.read(top_level).decode().split())
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith((".dist-info", ".data"))}
    assert tops == {"agent_async"}
    assert declared == {"agent_async"}


def test_wheel_has_every_module_and_data_file(wheel: Path) -> None:
    """Every .py of the library, py.typed, the Lua scripts and the migration templates of the checkout are
    in the wheel: a folder that [tool.setuptools] leaves out fails here, not in a user's import."""
    with zipfile.ZipFile(wheel) as zf:
        shipped = set(zf.namelist())
    data = _checkout_files(*DATA_PATTERNS)
    assert "agent_async/py.typed" in data
    assert not data - shipped, "package data missing from the wheel: see [tool.setuptools.package-data]"
    modules = _checkout_files("*.py")
    assert not modules - shipped, "modules missing from the wheel: see [tool.setuptools.packages.find]"


def test_base_requirements_are_what_the_library_imports(wheel: Path) -> None:
    """Requires-Dist without an extra names neither the app's packages nor a server's SQL driver."""
    meta = _metadata(wheel)
    requires = meta.get_all("Requires-Dist") or []
    base = {_name(r) for r in requires if not re.search(r"\bextra\s*==", r)}
    assert not base & NOT_IN_BASE, sorted(base & NOT_IN_BASE)
    assert {"arq", "redis", "sqlalchemy", "aiosqlite", "croniter", "alembic"} <= base
    assert {"app", "postgres", "mysql"} <= set(meta.get_all("Provides-Extra") or [])


def test_installed_wheel_imports_without_the_app_packages(wheel: Path, tmp_path: Path) -> None:
    """The installed wheel alone imports agent_async and every module in it with Quart, hypercorn, the
    server drivers and `app` blocked (None in sys.modules makes their import raise ImportError)."""
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(site), str(wheel)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # Every .py file of the installed copy (pkgutil.walk_packages would skip a folder without __init__.py),
    # but the Alembic env.py: it reads alembic.context.config at import, so only Alembic may import it.
    modules = sorted(
        ".".join(path.relative_to(site).with_suffix("").parts).removesuffix(".__init__")
        for path in (site / "agent_async").rglob("*.py")
        if path.name != "env.py"
    )
    assert len(modules) >= 10, modules
    script = f"""
import importlib, sys
for name in {BLOCKED_IMPORTS!r}:
    sys.modules[name] = None
import agent_async
assert agent_async.__file__.startswith({str(site)!r}), agent_async.__file__
for name in {modules!r}:
    importlib.import_module(name)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=_env(site), capture_output=True, text=True,
        timeout=120, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _env(site: Path) -> dict[str, str]:
    """The environment of the import check: the wheel's copy of the library first, no AGENT_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AGENT_"))}
    env["PYTHONPATH"] = str(site)
    env["PYTHONNOUSERSITE"] = "1"
    return env
