"""docs/start-vllm-serve.md as a reader runs it (``tests/support/start_pages.py``): the page's
commands against the real ``vllm serve`` this tier already runs (``vllm_serve_fronts``, the tiny
model, which plays the reader's ``my-model``); a fresh sidecar from the page's own line. Adds
about 3 s to the tier: a sidecar's start, a second's hang-up, a cancel by id. Named to sort
beside the other modules of ``vllm serve``, so that its idle engine is not kept running between
them (``tests/vllm/conftest.py``)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from bench.base.waiting import poll_until
from bench.harness.vllm_stack import MODEL, WAIT_S
from tests.support import start_pages
from tests.support import vllm_serve_fronts as serve_fronts
from tests.support.vllm_fixtures import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

# What the tier's `vllm serve` is started with (bench/harness/vllm_stack.py): the flags the
# page's line may use, since it plays that line.
STAND_IN_FLAGS = {"--served-model-name", "--port", "--host"}


def test_the_page_runs_against_the_real_vllm_serve(
    vllm_serve_fronts: serve_fronts.Served, tmp_path: Path
) -> None:
    vllm = urlsplit(vllm_serve_fronts.url).netloc
    poll_until(vllm_serve_fronts.idle, WAIT_S, "vLLM idle")
    with start_pages.reading(
        "start-vllm-serve.md", tmp_path, {"8000": vllm}, {"my-model": MODEL}
    ) as page:
        server = page.server()
        assert server[:2] == ["vllm", "serve"], server
        assert {a for a in server if a.startswith("--")} <= STAND_IN_FLAGS, server
        page.run()  # the sidecar
        page.run()  # a hang-up, and what was counted
        poll_until(vllm_serve_fronts.idle, WAIT_S, "vLLM idle after the hang-up")
        page.run()  # a cancel by id
        poll_until(vllm_serve_fronts.idle, WAIT_S, "vLLM idle after the cancel by id")
        assert vllm_serve_fronts.logged(" aborted."), "vLLM logged no abort"
        assert not page.todo
