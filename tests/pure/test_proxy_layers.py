"""The proxy's packages in layers: the HTTP/1.1 client below both its users, the cancel path
below both listeners. A module that imports upward is refused here, before it makes a cycle."""

from __future__ import annotations

import ast

import pytest

from tests.support.processes import REPO

# What each package may import from the proxy (its own modules included): nothing above it.
ALLOWED = {
    "upstream": {"upstream", "errors"},
    "cancel": {"cancel", "upstream", "errors", "vocabulary", "metrics", "config"},
}


def proxy_imports(package: str) -> set[str]:
    """The second-level names (``proxy.<name>``) imported anywhere in ``proxy/<package>``."""
    found: set[str] = set()
    for path in (REPO / "proxy" / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            found.update(n.split(".")[1] for n in names if n.startswith("proxy."))
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_lower_package_imports_nothing_above_it(package: str) -> None:
    assert proxy_imports(package) <= ALLOWED[package]


def test_the_client_is_used_by_the_relay_and_the_cancel_calls() -> None:
    assert "upstream" in proxy_imports("http")
    assert "upstream" in proxy_imports("cancel")
