"""The proxy's Triton bridge (``--cancel-adapter triton``) against a real Triton: HTTP
``generate`` and ``generate_stream`` carried over gRPC answer byte for byte as Triton's own HTTP
frontend answers them, and a client's hang-up, which Triton's HTTP frontend never sees
(``test_triton_cancel.py``), stops the model within a step or two in every stage: before the
answer, mid-stream, and in a silent phase such as a long prefill.
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
from typing import Any

import aiohttp
import numpy as np
import pytest
import tritonclient.http as triton_http
from yarl import URL

from bench.base.processes import Process
from bench.base.scrape import metric_sum
from bench.harness.triton.io import hang_up_http
from bench.harness.triton.server import TritonServer
from proxy.triton.infer import HEADER_LENGTH
from tests.triton.conftest import BRIDGE_TOKEN
from tests.triton.test_triton_cancel import LONG, SEEN_WITHIN_S, ended, request_id

pytestmark = pytest.mark.slow

SAMPLING = json.dumps({"max_tokens": 3})
HELLO = {"text_input": "hello", "sampling_parameters": SAMPLING}
CASES: list[tuple[str, object]] = [
    ("/v2/models/streamer/generate", HELLO),
    ("/v2/models/streamer/generate", HELLO | {"exclude_input_in_output": True}),
    ("/v2/models/streamer/versions/1/generate", HELLO),
    ("/v2/models/streamer/generate", HELLO | {"stream": True}),  # several responses: refused
    ("/v2/models/streamer/generate_stream", HELLO | {"stream": True}),
    (
        "/v2/models/streamer/generate_stream",
        {"text_input": "é ✓", "stream": True, "sampling_parameters": SAMPLING},
    ),
    (
        "/v2/models/streamer/generate_stream",
        {"text_input": "none", "sampling_parameters": json.dumps({"max_tokens": 0})},
    ),
    ("/v2/models/streamer/generate", HELLO | {"parameters": {"priority": 0, "tag": "x"}}),
    ("/v2/models/streamer/generate", {"prompt": "no text_input"}),
    ("/v2/models/nope/generate", HELLO),
    ("/v2/models/streamer/versions/9/generate", HELLO),
    ("/v2/models/slow/generate", {"INPUT0": [1.5, -2.0, 3.25]}),
    ("/v2/models/slow/generate", {"INPUT0": 4.0}),
    # Numbers in exponent form, powers of two (exact in FP32; rapidjson's digits are Python's
    # shortest for them: docs/proxy.md says where they part)
    ("/v2/models/slow/generate", {"INPUT0": [2**-30, 2**-20, 2.0**66, -(2**-40), 2.0**100]}),
    ("/v2/models/slow/generate_stream", {"INPUT0": [2**-30], "parameters": {"steps": 1}}),
    ("/v2/models/slow/generate", {"INPUT0": [1, 2], "parameters": {"steps": 1}}),
    ("/v2/models/slow/generate_stream", {"INPUT0": [0.5], "parameters": {"steps": 1}}),
]
FP32 = {"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2.5]}
BINARY_OUT = [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]
INFER: list[tuple[str, dict[str, Any], bytes]] = [  # model, JSON, binary data after it
    ("slow", {"inputs": [FP32]}, b""),
    ("slow", {"id": "abc", "inputs": [FP32], "outputs": [{"name": "OUTPUT0"}],
              "parameters": {"steps": 1}}, b""),
    ("slow", {"inputs": [FP32], "parameters": {"binary_data_output": True}}, b""),
    ("slow", {"inputs": [FP32], "outputs": BINARY_OUT}, b""),
    ("slow", {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32",
                          "parameters": {"binary_data_size": 8}}], "outputs": BINARY_OUT},
     struct.pack("<2f", 1, -2)),
    ("slow", {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32",
                          "data": [[1, 2]]}]}, b""),
    ("slow", {"inputs": [{"name": "INPUT0", "shape": [0], "datatype": "FP32", "data": []}]}, b""),
    ("slow", {"inputs": [FP32 | {"datatype": "FP64"}]}, b""),
    ("slow", {"inputs": [FP32 | {"name": "NOPE"}]}, b""),
    ("slow", {"inputs": [FP32], "outputs": [{"name": "NOPE"}]}, b""),
    ("streamer", {"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES",
                              "data": ["hi"]}]}, b""),  # decoupled: 501
    ("nope", {"inputs": [FP32]}, b""),
]  # fmt: skip  # fmt: skip


async def answered(session: aiohttp.ClientSession, url: str, body: object) -> tuple[Any, ...]:
    async with session.post(url, json=body) as answer:
        return answer.status, answer.headers.get("Content-Type"), await answer.read()


async def inferred(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], binary: bytes
) -> tuple[Any, ...]:
    head = json.dumps(body).encode()
    headers = {HEADER_LENGTH: str(len(head))} if binary else {}
    async with session.post(url, data=head + binary, headers=headers) as answer:
        content = (answer.headers.get("Content-Type"), answer.headers.get(HEADER_LENGTH))
        return answer.status, content, await answer.read()


async def test_infer_answers_through_the_bridge_as_triton_answers_it(
    triton: TritonServer, triton_bridge: Process
) -> None:
    """JSON and binary tensors both ways, requested outputs, ids, parameters, Triton's errors
    (a decoupled model's 501 included), byte for byte."""
    different = []
    async with aiohttp.ClientSession() as session:
        for model, body, binary in INFER:
            path = f"/v2/models/{model}/infer"
            theirs = await inferred(session, triton.url() + path, body, binary)
            ours = await inferred(session, triton_bridge.url() + path, body, binary)
            if ours != theirs:
                different.append(f"{path} {body}:\n  Triton {theirs}\n  bridge {ours}")
    assert not different, "\n".join(different)


@pytest.mark.parametrize("target", ["triton", "triton_bridge"])
def test_tritonclient_infers_through_the_bridge(
    request: pytest.FixtureRequest, target: str
) -> None:
    """Triton's own HTTP client (binary tensors by default) gets the same answer."""
    server: TritonServer | Process = request.getfixturevalue(target)
    client = triton_http.InferenceServerClient(server.url().removeprefix("http://"))
    try:
        tensor = triton_http.InferInput("INPUT0", [3], "FP32")
        tensor.set_data_from_numpy(np.array([1, 2, 3], dtype=np.float32))
        wanted = [triton_http.InferRequestedOutput("OUTPUT0")]
        result = client.infer("slow", [tensor], outputs=wanted, request_id="tc")
        assert result.as_numpy("OUTPUT0").tolist() == [2.0, 4.0, 6.0]
        assert result.get_response()["id"] == "tc"
    finally:
        client.close()


async def test_generate_answers_through_the_bridge_as_triton_answers_it(
    triton: TritonServer, triton_bridge: Process
) -> None:
    different = []
    async with aiohttp.ClientSession() as session:
        for path, body in CASES:
            theirs = await answered(session, triton.url() + path, body)
            ours = await answered(session, triton_bridge.url() + path, body)
            if ours != theirs:
                different.append(f"{path} {body}:\n  Triton {theirs}\n  bridge {ours}")
    assert not different, "\n".join(different)


SEQUENCE = [  # (INPUT0, parameters): the running sum is 2, 5, 9; then a refusal; then 1
    (2, {"sequence_id": 7, "sequence_start": True}),
    (3, {"sequence_id": 7}),
    (4, {"sequence_id": 7, "sequence_end": True}),
    (1, {}),  # no sequence id: refused
    (1, {"sequence_id": "abc", "sequence_start": True, "sequence_end": True}),
]


async def test_a_sequence_runs_through_the_bridge_as_it_runs_direct(
    triton: TritonServer, triton_bridge: Process
) -> None:
    """Sequence parameters (a numeric or a string id, start, end) reach Triton's sequence
    batcher: the stateful model sums the same sequence through the bridge as direct."""
    answers: dict[str, list[tuple[Any, ...]]] = {}
    async with aiohttp.ClientSession() as session:
        for name, base in (("direct", triton.url()), ("bridge", triton_bridge.url())):
            url = f"{base}/v2/models/sequence_sum/infer"
            answers[name] = []
            for value, parameters in SEQUENCE:
                tensor = {"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [value]}
                body = {"inputs": [tensor], "parameters": parameters}
                answers[name].append(await inferred(session, url, body, b""))
    sums = [json.loads(a[2])["outputs"][0]["data"] for a in answers["direct"] if a[0] == 200]
    assert sums == [[2.0], [5.0], [9.0], [1.0]], answers["direct"]
    assert answers["bridge"] == answers["direct"]


async def test_every_bridged_answer_names_the_proxy_and_the_call(
    triton_bridge: Process,
) -> None:
    """Answers, streams and errors alike carry the call's id (as the relay's answers do: the id
    in the proxy's log and its cancel) and ``Server: hangup-proxy``."""
    ids = set()
    async with aiohttp.ClientSession() as session:
        for path, body in [CASES[0], CASES[4], CASES[9], CASES[8]]:  # 200, stream, 404, 400
            async with session.post(triton_bridge.url() + path, json=body) as answer:
                await answer.read()
                assert answer.headers.get("Server") == "hangup-proxy", (path, answer.headers)
                ids.add(answer.headers.get("X-Request-Id"))
    assert None not in ids and len(ids) == 4, ids


async def test_a_body_triton_cannot_read_is_refused_in_its_error_shape(
    triton: TritonServer, triton_bridge: Process
) -> None:
    """Triton answers 500 to an input of the wrong type; the bridge refuses it before it goes up,
    with 400 (the client's fault) and the same ``{"error": message}`` shape."""
    body = {"INPUT0": "not a number"}
    async with aiohttp.ClientSession() as session:
        theirs = await answered(session, f"{triton.url()}/v2/models/slow/generate", body)
        ours = await answered(session, f"{triton_bridge.url()}/v2/models/slow/generate", body)
    assert theirs[0] == 500 and list(json.loads(theirs[2])) == ["error"]
    assert ours[0] == 400 and b"INPUT0" in json.loads(ours[2])["error"].encode()


async def test_a_hang_up_on_infer_through_the_bridge_stops_the_model(
    triton: TritonServer, triton_bridge: Process
) -> None:
    rid = request_id("infer")
    body = {"id": rid, "inputs": [FP32], "parameters": {"steps": LONG}}
    gone = await hang_up_http(f"{triton_bridge.url()}/v2/models/slow/infer", body, None, 0.3)
    end = await ended(triton, "slow", rid)
    assert end["how"] == "cancelled" and end["at"] - gone < SEEN_WITHIN_S, end


STAGES = {  # stage: (route, prefill_s, events to read before hanging up, hang up after)
    "before the answer": ("generate", 0.0, None, 0.3),
    "mid-stream": ("generate_stream", 0.0, 3, 30.0),
    "in a silent phase": ("generate_stream", 1.5, None, 0.3),
}


@pytest.mark.parametrize("stage", STAGES)
async def test_an_http_hang_up_through_the_bridge_stops_the_model(
    triton: TritonServer, triton_bridge: Process, stage: str
) -> None:
    route, prefill_s, events, after_s = STAGES[stage]
    prompt = request_id(stage.replace(" ", "-"))
    params = {"max_tokens": LONG, "prefill_s": prefill_s}
    body = {"text_input": prompt, "stream": route == "generate_stream",
            "sampling_parameters": json.dumps(params)}  # fmt: skip
    before = metric_sum(triton_bridge.url("admin"), "hangup_proxy_client_disconnects_total")
    url = f"{triton_bridge.url()}/v2/models/streamer/{route}"
    gone = await hang_up_http(url, body, events, after_s)
    end = await ended(triton, "streamer", prompt, by="prompt")
    assert end["how"] == "cancelled", end
    assert end["at"] - gone < SEEN_WITHIN_S, end  # not after the silent phase, not never
    after = metric_sum(triton_bridge.url("admin"), "hangup_proxy_client_disconnects_total")
    assert after == before + 1


async def _cancel_on_the_bridge(bridge: Process, request_id: str) -> float:
    """The bridge's own cancel by id (its token); when it was answered."""
    url = f"{bridge.url()}/v2/requests/{request_id}/cancel"
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, headers={"Authorization": f"Bearer {BRIDGE_TOKEN}"}) as answer,
    ):
        assert (answer.status, await answer.json()) == (
            200, {"request_id": request_id, "state": "cancelled"}
        )  # fmt: skip
    return time.time()


async def test_a_cancel_by_id_on_the_bridge_stops_the_model_before_its_answer(
    triton: TritonServer, triton_bridge: Process
) -> None:
    """Triton's HTTP frontend has no cancel by id (nor its gRPC one for a call it did not
    start): the bridge's own (``/v2/requests/{id}/cancel``) cancels the gRPC call it holds under
    the client's ``X-Request-Id``; the model stops as on a hang-up, the client gets 499."""
    rid = request_id("by-id-infer")
    body = {"id": rid, "inputs": [FP32], "parameters": {"steps": LONG}}
    url = f"{triton_bridge.url()}/v2/models/slow/infer"
    async with aiohttp.ClientSession() as session:
        post = asyncio.ensure_future(session.post(url, json=body, headers={"X-Request-Id": rid}))
        await ended(triton, "slow", rid, how="started")
        cancelled_at = await _cancel_on_the_bridge(triton_bridge, rid)
        async with await post as response:
            assert response.status == 499
            assert (await response.json())["error"]["type"] == "cancelled"
    end = await ended(triton, "slow", rid)
    assert end["how"] == "cancelled" and end["at"] - cancelled_at < SEEN_WITHIN_S, end


async def test_a_cancel_by_id_on_the_bridge_stops_the_model_mid_stream(
    triton: TritonServer, triton_bridge: Process
) -> None:
    prompt = request_id("by-id-stream")
    body = {"text_input": prompt, "stream": True,
            "sampling_parameters": json.dumps({"max_tokens": LONG})}  # fmt: skip
    url = f"{triton_bridge.url()}/v2/models/streamer/generate_stream"
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers={"X-Request-Id": prompt}) as response,
    ):
        assert response.status == 200
        await response.content.readline()  # an event came: the answer has begun
        cancelled_at = await _cancel_on_the_bridge(triton_bridge, prompt)
        # Cut: the connection closes without the last chunk (aiohttp says so either way).
        with pytest.raises((aiohttp.ClientPayloadError, RuntimeError)):
            async for _ in response.content.iter_any():
                pass
    end = await ended(triton, "streamer", prompt, by="prompt")
    assert end["how"] == "cancelled" and end["at"] - cancelled_at < SEEN_WITHIN_S, end


async def test_vllm_pr_55521_paths_and_a_group_cancel_on_the_bridge_stop_the_model(
    triton: TritonServer, triton_bridge: Process
) -> None:
    """A client written for vLLM PR 55521 in front of Triton (which has none of its paths): the
    bridge answers them itself, with its token. ``DELETE /v1/requests/{id}`` stops one stream's
    model (the PR's 200, then its 404 once ended), one group cancel stops a job's two streams,
    each answered."""
    auth = {"Authorization": f"Bearer {BRIDGE_TOKEN}"}
    url = f"{triton_bridge.url()}/v2/models/streamer/generate_stream"
    group = request_id("job")

    def body(prompt: str) -> dict[str, object]:
        return {"text_input": prompt, "stream": True,
                "sampling_parameters": json.dumps({"max_tokens": LONG})}  # fmt: skip

    async with aiohttp.ClientSession() as session:
        one = request_id("pr-one")
        jobs = [request_id("pr-job-a"), request_id("pr-job-b")]
        streams = [await session.post(url, json=body(one), headers={"X-Request-Id": one})]
        streams += [await session.post(url, json=body(p), headers={"X-Hangup-Group": group})
                    for p in jobs]  # fmt: skip
        for response in streams:
            assert response.status == 200
            await response.content.readline()  # the answer has begun
        async with session.delete(f"{triton_bridge.url()}/v1/requests/{one}", headers=auth) as r:
            assert (r.status, await r.json()) == (
                200, {"status": "cancelled", "request_id": one, "state": "cancelled"}
            )  # fmt: skip
        deleted_at = time.time()
        async with session.post(
            f"{triton_bridge.url()}/v2/groups/{group}/cancel", headers=auth
        ) as r:
            answer = await r.json()
        grouped_at = time.time()
        assert len(answer["cancelled_request_ids"]) == 2, answer
        for response in streams:
            with pytest.raises((aiohttp.ClientPayloadError, RuntimeError)):
                async for _ in response.content.iter_any():
                    pass
            response.close()
        async with session.delete(f"{triton_bridge.url()}/v1/requests/{one}", headers=auth) as r:
            assert r.status == 404  # ended: the PR's 404
    end = await ended(triton, "streamer", one, by="prompt")
    assert end["how"] == "cancelled" and end["at"] - deleted_at < SEEN_WITHIN_S, end
    for prompt in jobs:
        end = await ended(triton, "streamer", prompt, by="prompt")
        assert end["how"] == "cancelled" and end["at"] - grouped_at < SEEN_WITHIN_S, end


async def test_sixteen_http_streams_hung_up_at_once_each_stop_the_model(
    triton: TritonServer, triton_bridge: Process
) -> None:
    prompts = [request_id(f"bridge-many{i}") for i in range(16)]
    url = f"{triton_bridge.url()}/v2/models/streamer/generate_stream"
    sampling = json.dumps({"max_tokens": LONG})
    bodies = [{"text_input": p, "stream": True, "sampling_parameters": sampling} for p in prompts]
    gone = await asyncio.gather(*(hang_up_http(url, body, 2, 30.0) for body in bodies))
    ends = [await ended(triton, "streamer", p, by="prompt") for p in prompts]
    assert [e["how"] for e in ends] == ["cancelled"] * 16, ends
    assert max(e["at"] - g for e, g in zip(ends, gone, strict=True)) < SEEN_WITHIN_S, ends


async def test_a_hang_up_on_a_model_that_is_not_decoupled_stops_it(
    triton: TritonServer, triton_bridge: Process
) -> None:
    """``generate`` on the slow model is one ``ModelInfer``: cancelled like a stream."""
    first = float(time.monotonic_ns() % 1_000_000)  # the call's key: it carries no id
    body = {"INPUT0": [first], "parameters": {"steps": LONG}}
    gone = await hang_up_http(f"{triton_bridge.url()}/v2/models/slow/generate", body, None, 0.3)
    end = await ended(triton, "slow", first, by="first")
    assert end["how"] == "cancelled" and end["at"] - gone < SEEN_WITHIN_S, end


def _tensor(**fields: Any) -> dict[str, Any]:
    return {"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]} | fields


def _infer_text(text: str) -> tuple[str, bytes, dict[str, str]]:
    return "/v2/models/slow/infer", text.encode(), {}


def _binary(size: int, sent: int) -> tuple[str, bytes, dict[str, str]]:
    tensor = _tensor(shape=[2], parameters={"binary_data_size": size})
    del tensor["data"]
    head = json.dumps({"inputs": [tensor]}).encode()
    return "/v2/models/slow/infer", head + b"\0" * sent, {HEADER_LENGTH: str(len(head))}


ONE = json.dumps(_tensor())
MALFORMED: list[tuple[str, bytes, dict[str, str]]] = [  # issue 59's, and their neighbours
    _infer_text(json.dumps({"inputs": [_tensor(shape=["a"])]})),
    _infer_text(json.dumps({"inputs": [_tensor(shape=[None])]})),
    _infer_text(ONE.replace('"shape": [1]', '"shape": [1e999]').join(['{"inputs": [', "]}"])),
    _infer_text(json.dumps({"inputs": [_tensor(parameters={"binary_data_size": "abc"})]})),
    _infer_text(json.dumps({"inputs": [_tensor(parameters={"binary_data_size": 4})]})),
    _infer_text('{"id": "\\ud800", "inputs": [' + ONE + "]}"),
    _infer_text('{"id": 5, "inputs": [' + ONE + "]}"),
    _infer_text('{"parameters": {"p": "\\udfff", "steps": 1}, "inputs": [' + ONE + "]}"),
    _infer_text(f'{{"parameters": {{"p": {2**63}, "steps": 1}}, "inputs": [{ONE}]}}'),
    _infer_text(f'{{"parameters": {{"p": {-(2**63) - 1}, "steps": 1}}, "inputs": [{ONE}]}}'),
    _infer_text(json.dumps({"inputs": [_tensor(datatype="UINT8", data=[-1])]})),
    _infer_text(json.dumps({"inputs": [_tensor(data=[10**400])]})),
    _infer_text(json.dumps({"inputs": [_tensor(data=[1e300])], "parameters": {"steps": 1}})),
    _infer_text(ONE.replace("[1]}", f"[{'9' * 5000}]}}").join(['{"inputs": [', "]}"])),
    _infer_text(json.dumps({"inputs": [_tensor(datatype="BF16")]})),
    _infer_text(json.dumps({"inputs": [_tensor()],
                            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": 1}}]})),
    _binary(8, 12),  # longer than declared
    _binary(8, 4),  # shorter
    ("/v2/models/%ff/infer", ONE.join(['{"inputs": [', "]}"]).encode(), {}),
    ("/v2/models/%73low/infer", ONE.join(['{"inputs": [', "]}"]).encode(), {}),
    ("/v2/models/slow/%69nfer", ONE.join(['{"inputs": [', "]}"]).encode(), {}),
    ("/v2/models/slow/generate", b'{"INPUT0": 1' + b"0" * 400 + b"}", {}),
    ("/v2/models/slow/generate", b'{"INPUT0": ' + b"9" * 5000 + b"}", {}),
    ("/v2/models/streamer/generate", b'{"text_input": "\\ud800"}', {}),
    ("/v2/models/slow/generate", f'{{"INPUT0": 1, "parameters": {{"p": {2**63}, "steps": 1}}}}'
     .encode(), {}),
]  # fmt: skip


async def test_malformed_input_is_refused_as_triton_refuses_it(
    triton: TritonServer, triton_bridge: Process
) -> None:
    """Each body of issue 59 that the bridge answered 500 "the proxy failed" (and their
    neighbours), sent to Triton and to the bridge: where Triton answers 500 to a body it cannot
    read, the bridge answers 400 in Triton's ``{"error": ...}`` shape; where Triton answers 4xx,
    the bridge answers the same, byte for byte; where Triton reads it (a parameter beyond int64,
    FP32 data beyond a float's range), the bridge reads it as Triton does, byte for byte."""
    different = []
    async with aiohttp.ClientSession() as session:
        for path, body, headers in MALFORMED:
            answers = []
            for base in (triton.url(), triton_bridge.url()):
                url = URL(base + path, encoded=True)  # the path as written: %ff stays %ff
                async with session.post(url, data=body, headers=headers) as answer:
                    answers.append((answer.status, await answer.read()))
            (status, theirs), (ours_status, ours) = answers
            if status == 500:
                fine = ours_status == 400 and list(json.loads(ours)) == ["error"]
            else:
                fine = (ours_status, ours) == (status, theirs)
            if not fine:
                different.append(f"{path} {body[:80]!r}:\n  Triton {status} {theirs[:200]!r}"
                                 f"\n  bridge {ours_status} {ours[:200]!r}")  # fmt: skip
    assert not different, "\n".join(different)
