"""docs/start-gateway.md as a reader runs it (``tests/support/start_pages.py``): the gateway on the
simulated engine and the sidecar in front of it, each started from the page's own line, a hang-up
and a cancel by id; the page's line with vLLM's engine is read by the gateway's own parser (the
vLLM tier runs that engine). Beyond what the page shows, nothing is left in flight. About 2 s."""

from __future__ import annotations

from pathlib import Path

from bench.base.scrape import metric_sum
from bench.base.waiting import poll_until
from gateway_server.config import from_args
from gateway_server.engine.table import EngineName
from tests.support import start_pages


def test_the_page_runs_the_gateway_and_its_sidecar(tmp_path: Path) -> None:
    with start_pages.reading("start-gateway.md", tmp_path, {}, {}) as page:
        page.run()  # the gateway and the sidecar, from the page's lines
        page.run()  # a hang-up, and what the gateway counted
        page.run()  # a cancel by id
        gateway = page.started["gateway_server"].url()

        def idle() -> bool:
            return metric_sum(gateway, "hangup_gateway_inflight_requests") == 0

        poll_until(idle, 10, "nothing in flight at the gateway")
        vllm = page.server()
        assert vllm[0] == "hangup-gateway", vllm
        config = from_args(vllm[1:], {})
        assert (config.engine, config.served_model_name) == (EngineName.VLLM, "my-model")
        assert not page.todo
