"""The values a start page sends its reader to for a pod (docs/kubernetes.md, a block per preset)
as Helm renders them: each installs, and the sidecar in the pod runs the adapter the start page
runs on the reader's machine (docs/start-*.md, whose commands make test runs). About a second a
preset."""

from __future__ import annotations

import re

import pytest
import yaml

from bench.base.processes import REPO
from tests.deploy.test_chart import containers
from tests.support.chart import HelmEngine

DOCS = REPO / "docs"
PRESETS = {  # the heading in kubernetes.md: its start page
    "vllm serve": "start-vllm-serve.md",
    "Triton": "start-triton.md",
    "Truss": "start-truss.md",
}


def values_under(heading: str) -> dict[str, object]:
    """The first yaml block under ``### heading`` of docs/kubernetes.md."""
    text = (DOCS / "kubernetes.md").read_text()
    section = text.split(f"\n### {heading}\n", 1)[1].split("\n### ", 1)[0]
    block = re.search(r"```yaml\n(.*?)\n```", section, re.S)
    assert block, f"docs/kubernetes.md, {heading}: no values"
    return dict(yaml.safe_load(block.group(1)))


def adapter_of(page: str) -> str:
    """The adapter the start page's sidecar runs (``hangup-proxy ... --cancel-adapter X``)."""
    found = re.findall(r"hangup-proxy .*--cancel-adapter (\w+)", (DOCS / page).read_text())
    assert len(set(found)) == 1, f"docs/{page}: {found}"
    return str(found[0])


@pytest.mark.parametrize("heading", PRESETS)
def test_the_pod_of_each_start_page_installs_with_its_adapter(
    helm: HelmEngine, heading: str
) -> None:
    release = helm.render(values_under(heading))
    assert release.ok, release.error
    args = containers(release)["proxy"]["args"]
    assert f"--cancel-adapter={adapter_of(PRESETS[heading])}" in args, args
