"""docs/start-triton.md as a reader runs it (``tests/support/start_pages.py``): the page's
commands against the real Triton this tier already runs, whose ``streamer`` model (the inputs of
Triton's vLLM backend, a step every 50 ms, ``is_cancelled()`` asked each step) plays the reader's
``vllm_model``; a fresh sidecar from the page's own line. Beyond what the page shows, the model's
own record says it saw each call cancelled. Adds about 3 s to the tier."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from bench.base.waiting import poll_until
from bench.harness.triton.server import TritonServer
from tests.support import start_pages

# What the tier's tritonserver is started with (bench/harness/triton/server.py).
STAND_IN_FLAGS = {"--model-repository", "--http-port", "--grpc-port"}


def cancelled(triton: TritonServer, prompt: str) -> int:
    """How many calls with ``prompt`` the streamer model recorded as cancelled."""
    path = triton.records / "streamer.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return sum(1 for line in lines if line["prompt"] == prompt and line["how"] == "cancelled")


def test_the_page_runs_against_a_real_triton(triton: TritonServer, tmp_path: Path) -> None:
    prompt = f"start-page-{uuid.uuid4().hex}"
    ours = {"8000": triton.http, "8001": triton.grpc}
    words = {"vllm_model": "streamer", '"text_input": "Hi"': f'"text_input": "{prompt}"'}
    with start_pages.reading("start-triton.md", tmp_path, ours, words) as page:
        server = page.server()
        assert server[0] == "tritonserver", server
        assert {a for a in server if a.startswith("--")} <= STAND_IN_FLAGS, server
        page.run()  # the sidecar
        page.run()  # a hang-up, and what was counted
        poll_until(lambda: cancelled(triton, prompt) == 1, 10, "the model to see the hang-up")
        page.run()  # a cancel by id
        poll_until(lambda: cancelled(triton, prompt) == 2, 10, "the model to see the cancel")
        assert not page.todo
