"""The deploy tests' shared fixtures: Helm's engine, every ci/ scenario rendered once, and a
container engine with the CPU image (and the Truss image, for the pods of a server that is not
hangup's) built once for the session."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.chart import HelmEngine, Release, scenario, scenarios
from tests.support.containers import (
    CPU_IMAGE,
    REPORT,
    Engine,
    build_cpu_image,
    container_engine,
)
from tests.support.truss_image import MODEL, TRUSS_IMAGE, build_truss_image


@pytest.fixture(scope="session")
def helm() -> HelmEngine:
    return HelmEngine()  # Unavailable where there is none: a skip


@pytest.fixture(scope="session")
def renders(helm: HelmEngine) -> dict[str, Release]:
    """Each ci/ scenario rendered once for the session (an install takes about a second)."""
    return {name: helm.render(scenario(name)) for name in scenarios()}


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    with container_engine() as found:  # NoEngine (Unavailable) where none answers: a skip
        yield found


@pytest.fixture(scope="session")
def cpu_image(engine: Engine) -> Any:
    """The CPU image from the Dockerfile as it is, as localhost/hangup:test (a local build)."""
    image = build_cpu_image(engine, CPU_IMAGE)
    REPORT.append(f"images: built {CPU_IMAGE} with {engine.name}, on {engine.base_description()}")
    return image


@pytest.fixture(scope="session")
def truss_image(engine: Engine) -> Any:
    """Truss's own model server serving a model of the Truss tier's (tests/support/truss_image.py),
    as localhost/hangup-truss:test."""
    image = build_truss_image(engine)
    REPORT.append(f"images: built {TRUSS_IMAGE} (Truss 0.18.36's server, model {MODEL})")
    return image


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in REPORT:
        terminalreporter.write_line(line)
