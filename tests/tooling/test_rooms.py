"""Rooms by audience: the product and ``bench/`` never reach into the test suite, neither by import
nor by reading its files (the Triton and Truss tiers' models live beside the code that serves
them, ``bench/harness/triton/`` and ``bench/harness/truss/``). Docstrings and comments may name a
test; code may not."""

from __future__ import annotations

import ast

import pytest

from bench.base.processes import REPO

ROOMS = ("hangup_contract", "gateway_server", "proxy", "bench")


def reaches_into_tests(source: str) -> list[str]:
    """The lines of ``source`` that import ``tests`` or name a path under it outside a docstring."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) in docstrings:
                continue
            text = node.value
            names = ["tests"] if text == "tests" or text.startswith("tests/") else []
            names += ["tests"] if "/tests/" in text else []
        else:
            continue
        if any(name == "tests" or name.startswith("tests.") for name in names):
            found.append(node.lineno)
    return [f"line {n}" for n in sorted(found)]


@pytest.mark.parametrize("room", ROOMS)
def test_nothing_outside_the_suite_reads_or_imports_it(room: str) -> None:
    offenders = {
        str(path.relative_to(REPO)): lines
        for path in sorted((REPO / room).rglob("*.py"))
        if (lines := reaches_into_tests(path.read_text()))
    }
    assert not offenders, f"{room} reaches into tests/: {offenders}"


def test_the_check_sees_an_import_and_a_path_but_not_a_docstring() -> None:
    source = (
        '"""Run by ``tests/pure/test_x.py``."""\n'
        "from tests.support import x\n"
        'MODELS = REPO / "tests" / "triton"\n'
        'DATA = "tests/truss/models"\n'
    )
    assert reaches_into_tests(source) == ["line 2", "line 3", "line 4"]


BELOW = {  # what each shared room of bench/ may import of bench/: the rooms under it
    "base": {"base"},
    "harness": {"base", "harness"},
    "instruments": {"base", "instruments"},
}


def bench_rooms_imported(source: str) -> set[str]:
    """The rooms of ``bench/`` that ``source`` imports (``bench.<room>...``)."""
    rooms = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        else:
            continue
        rooms |= {name.split(".")[1] for name in names if name.startswith("bench.")}
    return rooms


@pytest.mark.parametrize("room", sorted(BELOW))
def test_a_shared_room_of_bench_imports_only_the_rooms_below_it(room: str) -> None:
    """The demos' room needs nothing else of ``bench/``; the tests' and benchmarks' machinery
    (``harness``) needs none of the benchmarks' own instruments, nor a benchmark."""
    above = {
        str(path.relative_to(REPO)): sorted(imported - BELOW[room])
        for path in sorted((REPO / "bench" / room).rglob("*.py"))
        if (imported := bench_rooms_imported(path.read_text())) - BELOW[room]
    }
    assert not above, f"bench/{room} imports rooms above it: {above}"


def test_the_room_check_sees_both_kinds_of_import_and_any_depth() -> None:
    source = (
        "from bench.instruments.stats import spread\n"
        "import bench.harness.stack\n"
        "def late():\n    from bench.proxy import cancel\n"
        "from benchmarks import x\n"
    )
    assert bench_rooms_imported(source) == {"instruments", "harness", "proxy"}
