"""KServe v2 HTTP and Triton's generate extension."""

from __future__ import annotations

import json
from typing import Any

from gateway_server.sse import SSEDecoder
from tests.support.gateway import MODEL, Gateway


async def stream_events(gw: Gateway, body: dict[str, Any]) -> list[dict[str, Any]]:
    decoder = SSEDecoder()
    events: list[dict[str, Any]] = []
    async with gw.session.post(f"{gw.url}/v2/models/{MODEL}/generate_stream", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        async for chunk in resp.content.iter_any():
            events.extend(json.loads(e.data) for e in decoder.feed(chunk))
    return events


async def test_health_and_metadata(gateway: Gateway) -> None:
    s, url = gateway.session, gateway.url
    async with s.get(f"{url}/v2/health/live") as r:
        assert r.status == 200
    async with s.get(f"{url}/v2/health/ready") as r:
        assert r.status == 200
    async with s.get(f"{url}/v2/models/{MODEL}") as r:
        meta = await r.json()
    assert {i["name"] for i in meta["inputs"]} >= {"text_input", "sampling_parameters"}
    assert [o["name"] for o in meta["outputs"]] == ["text_output"]
    async with s.get(f"{url}/v2/models/{MODEL}/ready") as r:
        assert r.status == 200
    async with s.get(f"{url}/v2/models/other/ready") as r:
        assert r.status == 404
        assert "'other' is not served" in (await r.json())["error"]


async def test_generate_includes_prompt_unless_excluded(gateway: Gateway) -> None:
    url = f"{gateway.url}/v2/models/{MODEL}/generate"
    body = {"text_input": "Once upon", "parameters": {"max_tokens": 4}}
    async with gateway.session.post(url, json=body) as r:
        with_prompt = (await r.json())["text_output"]
    body["parameters"]["exclude_input_in_output"] = True  # type: ignore[index]
    async with gateway.session.post(url, json=body) as r:
        answer = await r.json()
    assert answer["model_name"] == MODEL
    assert with_prompt == "Once upon" + answer["text_output"]
    assert len(answer["text_output"].split()) == 4


async def test_sampling_parameters_as_json_string(gateway: Gateway) -> None:
    url = f"{gateway.url}/v2/models/{MODEL}/generate"
    body = {"text_input": "x", "sampling_parameters": json.dumps({"max_tokens": 3}),
            "exclude_input_in_output": True}  # fmt: skip
    async with gateway.session.post(url, json=body) as r:
        assert len((await r.json())["text_output"].split()) == 3
    body["sampling_parameters"] = "{broken"
    async with gateway.session.post(url, json=body) as r:
        assert r.status == 400
        assert "'sampling_parameters' is not valid JSON" in (await r.json())["error"]


async def test_stream_flags_the_last_data_response_final(gateway: Gateway) -> None:
    events = await stream_events(gateway, {"text_input": "x", "parameters": {"max_tokens": 5}})
    assert [e["triton_final_response"] for e in events] == [False] * 4 + [True]
    assert all(e["text_output"] for e in events)


async def test_stream_with_empty_final_response_opt_in(gateway: Gateway) -> None:
    parameters = {"max_tokens": 3, "triton_enable_empty_final_response": True}
    body = {"text_input": "x", "id": "r7", "parameters": parameters}
    events = await stream_events(gateway, body)
    assert [e["triton_final_response"] for e in events] == [False, False, False, True]
    assert "text_output" not in events[-1]
    assert all(e["id"] == "r7" for e in events)


async def test_stream_cancelled_ends_with_an_error_event(gateway: Gateway) -> None:
    url = f"{gateway.url}/v2/models/{MODEL}/generate_stream"
    body = {"text_input": "x", "parameters": {"max_tokens": 4000}}
    decoder, events = SSEDecoder(), []
    async with gateway.session.post(url, json=body, headers={"X-Request-Id": "ks-1"}) as resp:
        async for chunk in resp.content.iter_any():
            events.extend(json.loads(e.data) for e in decoder.feed(chunk))
            if len(events) == 2:
                assert (await gateway.cancel("ks-1"))[0] == 200
    assert events[-1] == {"error": "request cancelled (explicit)"}
    assert gateway.cancellations("explicit", "decode") == 1
