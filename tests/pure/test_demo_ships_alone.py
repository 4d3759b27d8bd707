"""The demos run in the image, which ships ``bench/`` and the installed packages but not the test
suite (``.dockerignore``): nothing a demo imports, however deep, may come from ``tests``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.processes import REPO

DEMOS = ["bench.demo", "bench.demo_proxy"]  # the Dockerfile's own comment advertises them


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


@pytest.mark.parametrize("demo", DEMOS)
def test_a_demo_imports_nothing_from_the_test_suite(demo: str) -> None:
    seen, todo, reached_tests = set(), [demo], []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name.split(".")[0] == "tests":
            reached_tests.append(name)
            continue
        if name.split(".")[0] in ("bench", "hangup_contract", "gateway_server", "proxy") and (
            path := module_file(name)
        ):
            todo.extend(imported(path))
    assert not reached_tests, f"{demo} imports the test suite: {sorted(reached_tests)}"
