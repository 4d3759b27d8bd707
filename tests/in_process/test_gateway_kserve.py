"""KServe v2 HTTP and Triton's generate extension."""

from __future__ import annotations

import json
from typing import Any

import pytest

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


async def test_triton_clients_find_every_model_path_they_use(gateway: Gateway) -> None:
    """The paths tritonclient.http and Triton's docs use besides generation: a version in the
    path, the model's configuration, the repository index, ``/infer`` (501 on a decoupled model,
    as Triton answers), and Triton's error shape for any other path or method under /v2."""
    s, base = gateway.session, f"{gateway.url}/v2"
    async with s.get(f"{base}/models/{MODEL}/versions/1") as r:
        assert (r.status, (await r.json())["versions"]) == (200, ["1"])
    async with s.get(f"{base}/models/{MODEL}/versions/2/ready") as r:
        assert r.status == 404 and "no version '2'" in (await r.json())["error"]
    async with s.post(f"{base}/models/{MODEL}/versions/1/generate", json={"text_input": "a"}) as r:
        assert r.status == 200 and (await r.json())["model_version"] == "1"
    async with s.get(f"{base}/models/{MODEL}/config") as r:
        config = await r.json()
    assert config["model_transaction_policy"] == {"decoupled": True}
    assert config["input"][0]["name"] == "text_input"
    async with s.post(f"{base}/repository/index") as r:
        assert await r.json() == [{"name": MODEL, "version": "1", "state": "READY"}]
    async with s.post(f"{base}/models/{MODEL}/infer", json={"inputs": []}) as r:
        assert r.status == 501 and "decoupled" in (await r.json())["error"]
    async with s.put(f"{base}/models/{MODEL}/generate", json={}) as r:
        assert r.status == 405 and r.content_type == "application/json"
    async with s.get(f"{base}/nowhere") as r:
        assert r.status == 404 and "not an endpoint" in (await r.json())["error"]


async def test_answers_are_written_as_triton_writes_them(gateway: Gateway) -> None:
    """Compact JSON as ``application/json``; events as ``text/event-stream; charset=utf-8``."""
    url = f"{gateway.url}/v2/models/{MODEL}"
    async with gateway.session.post(f"{url}/generate", json={"text_input": "a"}) as r:
        assert r.headers["Content-Type"] == "application/json"
        assert (await r.text()).startswith('{"model_name":"')
    async with gateway.session.post(f"{url}/generate_stream", json={"text_input": "a"}) as r:
        assert r.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        assert (await r.text()).startswith('data: {"model_name":"')


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


SAMPLING = {"max_tokens": 6, "seed": 7, "top_k": 3, "min_p": 0.05, "logit_bias": {"5": 100},
            "min_tokens": 6}  # fmt: skip
"""Fields the OpenAI API honoured and KServe once ignored: the bias makes every token id 5."""


async def test_sampling_is_read_as_the_openai_api_reads_it(gateway: Gateway) -> None:
    s, url = gateway.session, gateway.url
    completion = {"model": MODEL, "prompt": "Once upon", **SAMPLING}
    async with s.post(f"{url}/v1/completions", json=completion) as r:
        assert r.status == 200, await r.text()
        expected = (await r.json())["choices"][0]["text"]
    bodies = [
        {"text_input": "Once upon", "parameters": {**SAMPLING, "exclude_input_in_output": True}},
        {"text_input": "Once upon", "sampling_parameters": json.dumps(SAMPLING),
         "exclude_input_in_output": True},
    ]  # fmt: skip
    for body in bodies:
        async with s.post(f"{url}/v2/models/{MODEL}/generate", json=body) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["text_output"] == expected
    unbiased = {"text_input": "Once upon", "exclude_input_in_output": True, "max_tokens": 6,
                "seed": 7}  # fmt: skip
    async with s.post(f"{url}/v2/models/{MODEL}/generate", json=unbiased) as r:
        assert (await r.json())["text_output"] != expected  # the fields changed the answer


@pytest.mark.parametrize(
    ("where", "name", "value", "says"),
    [
        ("parameters", "presence_penalty", 0.5, "is not supported by the simulated engine"),
        ("sampling_parameters", "repetition_penalty", 1.2, "is not supported by the simulated"),
        ("sampling_parameters", "best_of", 2, "is not a sampling parameter this gateway knows"),
        ("sampling_parameters", "seed", 2**64, "must be a 64-bit integer"),
    ],
)
async def test_a_sampling_field_the_gateway_cannot_honour_is_refused_by_name(
    gateway: Gateway, where: str, name: str, value: object, says: str
) -> None:
    body = {"text_input": "x", where: {"max_tokens": 2, name: value}}
    for path in ("generate", "generate_stream"):
        async with gateway.session.post(f"{gateway.url}/v2/models/{MODEL}/{path}", json=body) as r:
            assert r.status == 400
            assert f"'{name}' {says}" in (await r.json())["error"]


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


async def test_stream_cancelled_ends_with_an_error_event_saying_what_it_consumed(
    gateway: Gateway,
) -> None:
    url = f"{gateway.url}/v2/models/{MODEL}/generate_stream"
    body = {"text_input": "x", "parameters": {"max_tokens": 4000}}
    decoder, events, answer = SSEDecoder(), [], {}
    async with gateway.session.post(url, json=body, headers={"X-Request-Id": "ks-1"}) as resp:
        async for chunk in resp.content.iter_any():
            events.extend(json.loads(e.data) for e in decoder.feed(chunk))
            if len(events) == 2:
                status, answer = await gateway.cancel("ks-1")
                assert status == 200
    assert events[-1]["error"] == "request cancelled (explicit)"
    usage = events[-1]["parameters"]  # KServe response parameters, OpenAI's names
    assert usage["prompt_tokens"] == 1 and usage["completion_tokens"] >= len(events) - 1
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert answer["usage"] == usage  # the cancel's answer says the same
    assert gateway.cancellations("explicit", "decode") == 1


async def test_a_body_id_is_echoed_only_when_a_string_of_at_most_128_characters(
    gateway: Gateway,
) -> None:
    """Triton echoes any string ``id`` in every event; a 1 MiB one made the gateway write 300 MiB
    (issue 60). Any characters are taken, as Triton takes them, up to 128; a longer id, or one
    that is not a string, is refused in Triton's shape before anything runs."""
    for path in ("generate", "generate_stream"):
        url = f"{gateway.url}/v2/models/{MODEL}/{path}"
        for bad, says in (("i" * 129, "'id' is too long"), (7, "Unable to parse 'id'")):
            body = {"text_input": "x", "id": bad, "max_tokens": 3}
            async with gateway.session.post(url, json=body) as r:
                assert r.status == 400, (path, bad)
                answer = await r.json()
            assert list(answer) == ["error"] and says in answer["error"]
            assert len(json.dumps(answer)) < 200
    own = "ünïcode id / with spaces " + "x" * 103
    assert len(own) == 128
    events = await stream_events(gateway, {"text_input": "x", "id": own, "max_tokens": 3})
    assert [e["id"] for e in events] == [own] * 3
    events = await stream_events(gateway, {"text_input": "x", "id": "", "max_tokens": 1})
    assert "id" not in events[0]  # as Triton: an empty id is left out
    assert gateway.requests("completed", protocol="kserve_http") == 2
