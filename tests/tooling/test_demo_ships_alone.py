"""The demos run in the image, which ships ``bench/`` and hangup's base dependencies but not the
test suite or its extras (``.dockerignore``, ``Dockerfile``): nothing a demo imports, however
deep, may come from ``tests``, nor from a package hangup does not depend on (pytest, Hypothesis,
tritonclient...)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from bench.base.processes import REPO
from bench.catalog import CATALOG, Kind

DEMOS = [entry.module for entry in CATALOG if entry.kind is Kind.DEMO]  # the Dockerfile advertises
FIRST_PARTY = ("bench", "hangup_contract", "gateway_server", "proxy")
BASE = {  # what pyproject's `dependencies` install, by the name a module imports
    "aiohttp", "httptools", "uvloop", "prometheus_client", "grpc", "grpc_health",
    "grpc_reflection", "google",
}  # fmt: skip


def module_file(name: str) -> Path | None:
    path = REPO.joinpath(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def reached(demo: str) -> set[str]:
    """Every module ``demo`` imports, however deep through first-party modules."""
    seen, todo = set(), [demo]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name.split(".")[0] in FIRST_PARTY and (path := module_file(name)):
            todo.extend(imported(path))
    return seen


@pytest.mark.parametrize("demo", DEMOS)
def test_a_demo_imports_nothing_from_the_test_suite(demo: str) -> None:
    from_tests = sorted(n for n in reached(demo) if n.split(".")[0] == "tests")
    assert not from_tests, f"{demo} imports the test suite: {from_tests}"


@pytest.mark.parametrize("demo", DEMOS)
def test_a_demo_needs_only_the_base_dependencies(demo: str) -> None:
    tops = {n.split(".")[0] for n in reached(demo)}
    allowed = set(sys.stdlib_module_names) | set(FIRST_PARTY) | BASE | {"__future__", "tests"}
    assert tops <= allowed, f"{demo} imports what the image lacks: {sorted(tops - allowed)}"
