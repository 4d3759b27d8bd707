"""The OpenAI API with the real ``openai`` client, and bad input answered clearly."""

from __future__ import annotations

import aiohttp
import openai
import pytest

from tests.support.gateway import MODEL, Gateway, running_gateway


def openai_client(gw: Gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)


async def test_models_lists_the_served_model(gateway: Gateway) -> None:
    async with openai_client(gateway) as c:
        models = await c.models.list()
    assert [m.id for m in models.data] == [MODEL]


async def test_completion_streamed_equals_completion_unstreamed(gateway: Gateway) -> None:
    async with openai_client(gateway) as c:
        whole = await c.completions.create(model=MODEL, prompt="tell me", max_tokens=12)
        stream = await c.completions.create(
            model=MODEL, prompt="tell me", max_tokens=12, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        pieces, usage, finish = [], None, None
        async for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for choice in chunk.choices:
                pieces.append(choice.text)
                finish = choice.finish_reason or finish
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 12
    assert "".join(pieces) == whole.choices[0].text
    assert len(pieces) == 12  # one event per token: nothing batched
    assert finish == "length"
    assert usage is not None and usage.prompt_tokens == 2 and usage.completion_tokens == 12
    assert gateway.requests("completed") == 2


async def test_chat_completion_streaming_and_not(gateway: Gateway) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    async with openai_client(gateway) as c:
        whole = await c.chat.completions.create(model=MODEL, messages=messages, max_tokens=6)  # type: ignore[arg-type]
        stream = await c.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=6, stream=True,  # type: ignore[arg-type]
        )  # fmt: skip
        text = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].message.content == text
    assert len(text.split()) == 6


async def test_n_choices_run_side_by_side(gateway: Gateway) -> None:
    async with openai_client(gateway) as c:
        result = await c.completions.create(model=MODEL, prompt="x y z", max_tokens=3, n=3)
    assert sorted(ch.index for ch in result.choices) == [0, 1, 2]
    assert result.usage is not None
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (3, 9)


async def test_request_id_is_echoed_and_generated(gateway: Gateway) -> None:
    body = {"model": MODEL, "prompt": "a", "max_tokens": 1}
    url = f"{gateway.url}/v1/completions"
    async with gateway.session.post(url, json=body, headers={"X-Request-Id": "mine-1"}) as resp:
        assert resp.headers["X-Request-Id"] == "mine-1"
    async with gateway.session.post(url, json=body) as resp:
        assert len(resp.headers["X-Request-Id"]) == 32


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (b'{"prompt": "x"}', 400, "'model' is required"),
        (b'{"model": "nope", "prompt": "x"}', 404, "'nope' is not served"),
        (b'{"model": "hangup-sim", "prompt": 5}', 400, "'prompt' must be"),
        (
            b'{"model": "hangup-sim", "prompt": "x", "max_tokens": "9"}',
            400,
            "'max_tokens' must be an integer",
        ),
        (
            b'{"model": "hangup-sim", "prompt": "x", "max_tokens": true}',
            400,
            "'max_tokens' must be an integer",
        ),
        (b'{"model": "hangup-sim", "prompt": "x", "max_tokens": 0}', 400, "between 1 and 4096"),
        (b'{"model": "hangup-sim", "prompt": "x", "max_tokens": 5000}', 400, "between 1 and 4096"),
        (b'{"model": "hangup-sim", "prompt": "x", "temperature": 3}', 400, "'temperature'"),
        (b'{"model": "hangup-sim", "prompt": "x", "n": 99}', 400, "'n'"),
        (
            b'{"model": "hangup-sim", "prompt": "x", "stream": "yes"}',
            400,
            "'stream' must be a boolean",
        ),
    ],
)
async def test_bad_input_gets_a_clear_openai_error(
    gateway: Gateway, body: bytes, status: int, needle: str
) -> None:
    async with gateway.session.post(f"{gateway.url}/v1/completions", data=body) as resp:
        assert resp.status == status
        error = (await resp.json())["error"]
    assert needle in error["message"]
    assert error["code"] == status and error["type"]


async def test_bad_chat_messages_are_refused(gateway: Gateway) -> None:
    for messages in ([], [{"role": "wizard", "content": "x"}], [{"role": "user", "content": 3}]):
        body = {"model": MODEL, "messages": messages}
        async with gateway.session.post(f"{gateway.url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 400, messages
            assert "messages" in (await resp.json())["error"]["message"]


async def test_prompt_longer_than_the_model_allows() -> None:
    from gateway_server.engine.sim.config import SimConfig

    async with running_gateway(sim=SimConfig(max_model_len=64)) as gw:
        body = {"model": MODEL, "prompt": "w " * 60, "max_tokens": 10}
        async with gw.session.post(f"{gw.url}/v1/completions", json=body) as resp:
            assert resp.status == 400
            assert (
                "exceeds the model's context length of 64"
                in (await resp.json())["error"]["message"]
            )


async def test_body_over_the_limit_is_413_and_others_are_unharmed() -> None:
    async with running_gateway(max_body_bytes=2048) as gw:
        big = {"model": MODEL, "prompt": "x" * 4096}
        async with gw.session.post(f"{gw.url}/v1/completions", json=big) as resp:
            assert resp.status == 413
            assert "2048 bytes" in (await resp.json())["error"]["message"]
        ok = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        async with gw.session.post(f"{gw.url}/v1/completions", json=ok) as resp:
            assert resp.status == 200
        assert gw.requests("completed") == 1
        # The body was never read, so the model is not known: the label says so.
        rejected = gw.metric(
            "hangup_gateway_requests_total", model="unknown", protocol="openai", outcome="rejected"
        )
        assert rejected == 1


async def test_duplicate_request_id_in_flight_is_409(gateway: Gateway) -> None:
    url = f"{gateway.url}/v1/completions"
    headers = {"X-Request-Id": "dup"}
    long = {"model": MODEL, "prompt": "x", "max_tokens": 4000, "stream": True}
    async with gateway.session.post(url, json=long, headers=headers) as first:
        await first.content.readline()
        async with (
            aiohttp.ClientSession() as other,
            other.post(url, json={"model": MODEL, "prompt": "x"}, headers=headers) as second,
        ):
            assert second.status == 409
            assert "already in flight" in (await second.json())["error"]["message"]
        status, _ = await gateway.cancel("dup")
        assert status == 200


@pytest.mark.parametrize(
    "messages",
    [[{"role": [], "content": "x"}], [{"role": {"a": 1}}], ["user"], [{"role": "user"}]],
)
async def test_malformed_chat_messages_are_a_clear_400(
    gateway: Gateway, messages: list[object]
) -> None:
    """A role of the wrong type was a 500 until property testing found it."""
    body = {"model": MODEL, "messages": messages}
    async with gateway.session.post(f"{gateway.url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 400, await resp.text()
        assert "messages[0]" in (await resp.json())["error"]["message"]
