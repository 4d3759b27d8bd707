"""Both packages in layers, read from their imports: ``import a.b``, ``from a.b import c``,
``from a import b``, imports under ``TYPE_CHECKING`` and ``import_module("a.b")`` alike. A module
that imports upward, or closes a circle of imports, is refused here before it grows.

A *part* is a package's top-level module or subpackage (``gateway_server.engine``,
``proxy.http``); a rule says which parts a part may import, or must not.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.base.processes import REPO

PACKAGES = ("proxy", "gateway_server")

MAY_ONLY_IMPORT = {
    # The engines stay behind their seam: no request parsing, no errors of the API, no config.
    ("gateway_server", "engine"): {"engine"},
    # Where an engine request runs: below the registry and the service, which call it.
    ("gateway_server", "placement"): {"placement", "engine"},
    # The API processes (one or several, their supervisor, their shared state), below the
    # service and the protocol adapters.
    ("gateway_server", "siblings"): {"siblings", "errors", "metrics", "registry", "config"},
    # The HTTP/1.1 client, below both its users (the relay and the cancel calls).
    ("proxy", "upstream"): {"upstream", "errors"},
    # The cancel path, below both listeners.
    ("proxy", "cancel"): {
        "cancel", "upstream", "errors", "labels", "metrics", "config",
    },
    # A relayed call (its ids, its place in flight, its end, the calls by id), below the
    # listeners and the server, above the cancel path.
    ("proxy", "calls"): {"calls", "cancel", "config", "errors", "labels", "metrics"},
}  # fmt: skip

MUST_NOT_IMPORT = {
    # One engine's package knows nothing of another's: each sits behind the seam alone.
    ("gateway_server.engine", "sim"): {"vllm"},
    ("gateway_server.engine", "vllm"): {"sim"},
}

ADAPTERS = {"http", "grpc"}
"""The protocol adapters: each package's top, with the server that runs them."""
ABOVE_THE_ADAPTERS = {"server", "cli", "__main__"}


def module_files(package: str) -> Iterator[tuple[str, Path]]:
    """Each module of ``package`` (dotted) as (its part, its file)."""
    root = REPO.joinpath(*package.split("."))
    for path in sorted(root.rglob("*.py")):
        part = path.relative_to(root).parts[0].removesuffix(".py")
        yield part, path


def _is_part(package: str, name: str) -> bool:
    root = REPO.joinpath(*package.split("."))
    return (root / f"{name}.py").exists() or (root / name).is_dir()


def imported_names(path: Path, package: str) -> set[str]:
    """Every module of ``package`` that the file at ``path`` imports, dotted."""
    return {n for n in all_imported_names(path) if n.startswith(f"{package}.")}


def all_imported_names(path: Path) -> set[str]:
    """Every module the file at ``path`` imports, dotted (and each ``from`` name after it)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name | ast.Attribute)
            and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr)
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
    return names


def imported_parts(path: Path, package: str) -> set[str]:
    """The parts of ``package`` that the file at ``path`` imports (``from gateway_server
    import sse`` included; a name that is no module, such as ``__version__``, is not a part)."""
    depth = package.count(".") + 1
    parts = {name.split(".")[depth] for name in imported_names(path, package)}
    return {part for part in parts if _is_part(package, part)}


def part_imports(package: str, part: str) -> set[str]:
    return {
        name
        for owner, path in module_files(package)
        if owner == part
        for name in imported_parts(path, package)
    }


@pytest.mark.parametrize(("package", "part"), sorted(MAY_ONLY_IMPORT))
def test_a_lower_part_imports_nothing_above_it(package: str, part: str) -> None:
    assert part_imports(package, part) <= MAY_ONLY_IMPORT[package, part]


@pytest.mark.parametrize(("package", "part"), sorted(MUST_NOT_IMPORT))
def test_a_part_imports_nothing_of_its_peers(package: str, part: str) -> None:
    assert not part_imports(package, part) & MUST_NOT_IMPORT[package, part]


@pytest.mark.parametrize("package", PACKAGES)
def test_only_the_server_imports_the_protocol_adapters(package: str) -> None:
    wrong = {
        f"{part}: {path.relative_to(REPO)}"
        for part, path in module_files(package)
        if part not in ABOVE_THE_ADAPTERS
        for imported in imported_parts(path, package) & ADAPTERS
        if imported != part  # an adapter's own modules
    }
    assert not wrong, f"imports a protocol adapter: {sorted(wrong)}"


def test_nothing_outside_the_engines_imports_vllm() -> None:
    outside = {
        str(path.relative_to(REPO))
        for part, path in module_files("gateway_server")
        if part != "engine"
        and any(n == "vllm" or n.startswith("vllm.") for n in all_imported_names(path))
    }
    assert not outside, f"import vLLM outside gateway_server/engine: {sorted(outside)}"


def module_graph(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` (dotted) and the modules of it that it imports."""
    modules = {}
    for _, path in module_files(package):
        dotted = ".".join(path.relative_to(REPO).with_suffix("").parts)
        modules[dotted.removesuffix(".__init__")] = path

    def module_of(name: str) -> str:
        while name not in modules:  # ``from a.b import c`` where c is a name in a.b
            name = name.rpartition(".")[0]
        return name

    return {
        module: {
            target
            for target in map(module_of, imported_names(path, package))
            if target != module and not module.startswith(f"{target}.")  # its own package
        }
        for module, path in modules.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_circle_of_imports(package: str) -> None:
    assert circles(module_graph(package)) == []


def test_a_circle_is_found_and_an_upward_import_is_read() -> None:
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}
    assert circles(graph) == [["p.a", "p.b", "p.c"]]
    # the forms a layer rule must see: a module imported from its package, a lazy import
    openai = REPO / "gateway_server" / "http" / "openai.py"
    assert "sse" in imported_parts(openai, "gateway_server")
    table = REPO / "gateway_server" / "engine" / "table.py"
    assert "gateway_server.engine.vllm.factory" in imported_names(table, "gateway_server")
