"""The chart tests' shared fixtures: Helm's engine, and every ci/ scenario rendered once."""

from __future__ import annotations

import pytest

from tests.support.chart import HelmEngine, Release, scenario, scenarios


@pytest.fixture(scope="session")
def helm() -> HelmEngine:
    try:
        return HelmEngine()
    except LookupError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def renders(helm: HelmEngine) -> dict[str, Release]:
    """Each ci/ scenario rendered once for the session (an install takes about a second)."""
    return {name: helm.render(scenario(name)) for name in scenarios()}
