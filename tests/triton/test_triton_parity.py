"""The gateway's KServe v2 HTTP surface next to a real Triton's, request by request.

Triton serves the tier's streamer model (the interface of Triton's vLLM backend); the gateway
serves its simulated engine under the same model name, with the same inputs and outputs. Texts
differ (different models); shapes must not: the status, the content type, and the JSON's keys
and value types (every SSE event's, for a stream). Where the gateway differs on purpose the case
says why, and the table in docs/triton-parity.md, which the test keeps current
(``HANGUP_WRITE_PARITY=1`` rewrites it), says so too. Triton's own clients are checked beside
it: every ``tritonclient.http`` call that reads the server works on both.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import tritonclient.http as triton_http

from bench.base.processes import REPO, Process
from bench.harness.triton.server import TritonServer

DOC = REPO / "docs" / "triton-parity.md"
TABLE_START, TABLE_END = "<!-- parity table: start -->", "<!-- parity table: end -->"
MODEL = "streamer"
SAMPLING = json.dumps({"max_tokens": 3})

PLAIN_HEALTH = (
    "Triton answers health with an empty text/plain body; the gateway with KServe v2's JSON "
    '(`{"live": true}`, `{"ready": true}`), which the protocol defines: clients read the status'
)
CLIENT_FAULT = "Triton answers 500 to a malformed request; the gateway 400: the client's fault"


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str
    body: object = None  # a dict is sent as JSON, a str as it is
    kept: str = ""  # why the gateway differs on purpose ("": it must not)
    subset: bool = False  # the gateway's keys must be Triton's, not all of them


CASES = [
    Case("server metadata", "GET", "/v2"),
    Case("live", "GET", "/v2/health/live", kept=PLAIN_HEALTH),
    Case("ready", "GET", "/v2/health/ready", kept=PLAIN_HEALTH),
    Case("model metadata", "GET", "/v2/models/{m}"),
    Case("model metadata, version 1", "GET", "/v2/models/{m}/versions/1"),
    Case("model metadata, unknown version", "GET", "/v2/models/{m}/versions/7"),
    Case("model metadata, unknown model", "GET", "/v2/models/nope"),
    Case("model ready", "GET", "/v2/models/{m}/ready", kept=PLAIN_HEALTH),
    Case("model ready, unknown model", "GET", "/v2/models/nope/ready",
         kept="Triton answers 400 (its JSON labelled text/plain); the gateway 404 in JSON, as "
              "both answer every other call that names an unknown model"),
    Case("model config", "GET", "/v2/models/{m}/config", subset=True),
    Case("repository index", "POST", "/v2/repository/index", {}),
    Case("model statistics", "GET", "/v2/models/{m}/stats",
         kept="not served (404): the gateway's counters are its Prometheus metrics"),
    Case("generate", "POST", "/v2/models/{m}/generate",
         {"text_input": "hi", "sampling_parameters": SAMPLING}),
    Case("generate, excluding the input", "POST", "/v2/models/{m}/generate",
         {"text_input": "hi", "exclude_input_in_output": True, "sampling_parameters": SAMPLING}),
    Case("generate, version 1", "POST", "/v2/models/{m}/versions/1/generate",
         {"text_input": "hi", "sampling_parameters": SAMPLING}),
    Case("generate with stream true", "POST", "/v2/models/{m}/generate",
         {"text_input": "hi", "stream": True, "sampling_parameters": SAMPLING},
         kept="Triton refuses a decoupled model's several responses on generate (200 with an "
              "error); the gateway answers the whole text"),
    Case("generate_stream", "POST", "/v2/models/{m}/generate_stream",
         {"text_input": "hi", "stream": True, "sampling_parameters": SAMPLING},
         kept="each event also says `triton_final_response` (true on the last): Triton's HTTP "
              "stream has no end marker, so a client cannot tell a whole answer from a cut one"),
    Case("generate without text_input", "POST", "/v2/models/{m}/generate", {"prompt": "hi"}),
    Case("generate, text_input not a string", "POST", "/v2/models/{m}/generate",
         {"text_input": 5}, kept=CLIENT_FAULT),
    Case("generate, body not JSON", "POST", "/v2/models/{m}/generate", "not json",
         kept=CLIENT_FAULT),
    Case("generate, an id of 128 characters", "POST", "/v2/models/{m}/generate",
         {"text_input": "hi", "id": "a request / " + "x" * 116, "sampling_parameters": SAMPLING}),
    Case("generate_stream, an id of 129 characters", "POST", "/v2/models/{m}/generate_stream",
         {"text_input": "hi", "id": "x" * 129, "sampling_parameters": SAMPLING},
         kept="refused (400) before it runs: Triton takes an id of any length and repeats it in "
              "every event (a 1 MiB id, 300 MiB of events); the gateway takes any string of up "
              "to 128 characters"),
    Case("generate, an id not a string", "POST", "/v2/models/{m}/generate",
         {"text_input": "hi", "id": 7}, kept=CLIENT_FAULT),
    Case("generate, unknown model", "POST", "/v2/models/nope/generate", {"text_input": "hi"}),
    Case("generate, wrong method", "PUT", "/v2/models/{m}/generate", {}),
    Case("infer on the decoupled model", "POST", "/v2/models/{m}/infer",
         {"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["hi"]}]},
         kept="the same 501 and error; Triton labels that JSON text/plain, the gateway "
              "application/json"),
]  # fmt: skip


def shape(value: Any) -> Any:
    """What a client's parser relies on: keys and value types, not values."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return "number" if type(value) in (int, float) else type(value).__name__


@dataclass(frozen=True)
class Reading:
    status: int
    content_type: str
    shape: Any

    def cell(self) -> str:
        return f"{self.status} `{self.content_type or '-'}`"


async def read(session: aiohttp.ClientSession, base: str, case: Case) -> Reading:
    options: dict[str, Any] = {}
    if isinstance(case.body, str):
        options["data"] = case.body
    elif case.body is not None:
        options["json"] = case.body
    url = base + case.path.format(m=MODEL)
    async with session.request(case.method, url, **options) as answer:
        text = await answer.text()
        content_type = answer.headers.get("Content-Type", "")
    if content_type.startswith("text/event-stream"):
        events = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
        found: Any = sorted({json.dumps(shape(e), sort_keys=True) for e in events})
    else:
        try:
            found = shape(json.loads(text)) if text else "empty"
        except json.JSONDecodeError:
            found = "not JSON"
    return Reading(answer.status, content_type, found)


def contained(ours: Any, theirs: Any) -> bool:
    """Every key of ours is Triton's, with the same shape (deep)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return all(k in theirs and contained(v, theirs[k]) for k, v in ours.items())
    if isinstance(ours, list) and isinstance(theirs, list) and ours and theirs:
        return contained(ours[0], theirs[0])
    return bool(ours == theirs)


async def test_the_gateway_answers_in_triton_shapes(
    triton: TritonServer, sim_gateway: Process
) -> None:
    rows, failures = [], []
    async with aiohttp.ClientSession() as session:
        for case in CASES:
            theirs = await read(session, triton.url(), case)
            ours = await read(session, sim_gateway.url(), case)
            same = (theirs.status, theirs.content_type) == (ours.status, ours.content_type) and (
                contained(ours.shape, theirs.shape) if case.subset else ours.shape == theirs.shape
            )
            if same and case.kept:
                failures.append(f"{case.name}: now the same as Triton; drop its reason")
            if not same and not case.kept:
                failures.append(f"{case.name}: Triton {theirs}, gateway {ours}")
            verdict = "same shape" if same else f"differs: {case.kept}"
            rows.append(f"| {case.method} `{case.path}` | {case.name} | {theirs.cell()} "
                        f"| {ours.cell()} | {verdict} |")  # fmt: skip
    assert not failures, "\n".join(failures)
    table = "\n".join(["| request | case | Triton 2.51 | gateway | outcome |",
                       "|---|---|---|---|---|", *rows])  # fmt: skip
    kept_current(table, TABLE_START, TABLE_END)


def kept_current(table: str, start: str, end: str) -> None:
    """``table`` must stand between the ``start`` and ``end`` markers of docs/triton-parity.md;
    with ``HANGUP_WRITE_PARITY=1`` it is written there first."""
    if os.environ.get("HANGUP_WRITE_PARITY"):
        head, _, rest = DOC.read_text().partition(start)
        _, _, tail = rest.partition(end)
        DOC.write_text(f"{head}{start}\n{table}\n{end}{tail}")
    assert table in DOC.read_text(), f"{DOC} is out of date: run with HANGUP_WRITE_PARITY=1"


@pytest.mark.parametrize("target", ["triton", "sim_gateway"])
def test_tritonclient_reads_the_server_and_the_model(
    request: pytest.FixtureRequest, target: str
) -> None:
    server: TritonServer | Process = request.getfixturevalue(target)
    address = server.url().removeprefix("http://")
    client = triton_http.InferenceServerClient(address)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready(MODEL) and client.is_model_ready(MODEL, "1")
        assert "extensions" in client.get_server_metadata()
        metadata = client.get_model_metadata(MODEL, "1")
        assert metadata["inputs"][0]["name"] == "text_input"
        assert client.get_model_config(MODEL)["model_transaction_policy"]["decoupled"] is True
        assert {"name": MODEL, "version": "1", "state": "READY"} in (
            client.get_model_repository_index()
        )
    finally:
        client.close()
