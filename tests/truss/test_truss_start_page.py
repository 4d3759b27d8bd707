"""docs/start-truss.md as a reader runs it (``tests/support/start_pages.py``): the page's
commands against the Truss server this tier already runs for its ``polling`` model (an async
``predict`` asking ``is_disconnected()`` every 20 ms; its input is ``{"id", "steps"}``, so the
page's ``prompt`` and ``max_tokens`` become those); a fresh sidecar from the page's own line.
Beyond what the page shows, the model's own record says it saw each call go. Adds about 3 s."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from bench.base.waiting import poll_until
from tests.support import start_pages
from tests.truss.conftest import Pod

# What the tier runs in place of `truss image run` (bench/harness/truss/server.py): the same
# server the image runs, without Docker; the page's line may set its port.
STAND_IN_FLAGS = {"--port"}


def test_the_page_runs_against_truss_own_server(truss_pods: dict[str, Pod], tmp_path: Path) -> None:
    server = truss_pods["polling"].server
    call = f"start-page-{uuid.uuid4().hex}"
    words = {'"prompt": "Hi"': f'"id": "{call}"', '"max_tokens"': '"steps"'}

    def gone() -> int:
        """How many times the model saw a call with the page's id go."""
        text = (server.records / "polling.jsonl").read_text()
        records = [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]
        return sum(1 for r in records if r["id"] == call and r["how"] == "disconnected")

    with start_pages.reading("start-truss.md", tmp_path, {"8000": server.http}, words) as page:
        line = page.server()
        assert line[:3] == ["truss", "image", "run"], line
        assert {a for a in line if a.startswith("--")} <= STAND_IN_FLAGS, line
        page.run()  # the sidecar
        page.run()  # a hang-up, and what was counted
        poll_until(lambda: gone() == 1, 10, "the model to see the hang-up")
        page.run()  # a cancel by id (a call with the same id)
        poll_until(lambda: gone() == 2, 10, "the model to see the cancel")
        assert not page.todo
