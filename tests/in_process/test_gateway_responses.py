"""The Responses API with the real ``openai`` client: plain, streamed (event by event),
background, retrieve, cancel, delete, ``previous_response_id``, the store's bounds, and refusals
by name."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from bench.base.waiting import wait_until
from gateway_server.engine.sim.config import SimConfig
from tests.support.gateway import LONG, MODEL, Gateway, running_api_processes, running_gateway

ONE_SLOT = SimConfig(slots=1, step_base_s=0.005)


def client(gw: Gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)


async def events_of(resp: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    """Every event's data until the server ends the stream, checking each ``event:`` name."""
    out, name = [], None
    async for raw in resp.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            event = json.loads(line[6:])
            assert event["type"] == name
            out.append(event)
    return out


async def created_id(resp: aiohttp.ClientResponse) -> str:
    """The response's id, from its stream's first event (``response.created``)."""
    block = await resp.content.readuntil(b"\n\n")
    assert block.startswith(b"event: response.created\n"), block
    return str(json.loads(block.split(b"data: ", 1)[1])["response"]["id"])


async def first_delta(resp: aiohttp.ClientResponse) -> None:
    """Read up to the end of the first text delta: the response is decoding."""
    await resp.content.readuntil(b"event: response.output_text.delta\n")
    await resp.content.readuntil(b"\n\n")


async def post(gw: Gateway, body: dict[str, Any], rid: str | None = None) -> aiohttp.ClientResponse:
    headers = {"X-Request-Id": rid} if rid else {}
    return await gw.session.post(f"{gw.url}/v1/responses", json=body, headers=headers)


async def test_plain_response_and_retrieve(gateway: Gateway) -> None:
    async with client(gateway) as c:
        made = await c.responses.create(model=MODEL, input="tell me", max_output_tokens=7)
        again = await c.responses.retrieve(made.id)
        chat = await c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "tell me"}], max_tokens=7
        )
    assert made.id.startswith("resp_") and made.object == "response"
    assert made.status == "incomplete" and made.incomplete_details is not None
    assert made.incomplete_details.reason == "max_output_tokens"
    assert made.output_text == chat.choices[0].message.content  # the same prompt, the same text
    assert made.output[0].type == "message" and made.output[0].role == "assistant"
    assert made.usage is not None and made.usage.output_tokens == 7
    assert made.usage.input_tokens == chat.usage.prompt_tokens  # type: ignore[union-attr]
    assert made.usage.total_tokens == made.usage.input_tokens + 7
    assert again.model_dump() == made.model_dump()
    assert gateway.requests("completed") == 2


async def test_stream_events_in_order(gateway: Gateway) -> None:
    async with client(gateway) as c:
        stream = await c.responses.create(model=MODEL, input="hi", max_output_tokens=3, stream=True)
        events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # max_output_tokens reached
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    created, last = events[0], events[-1]
    assert created.response.status == "in_progress"  # type: ignore[union-attr]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[7].text == text  # type: ignore[union-attr]
    assert last.response.output_text == text  # type: ignore[union-attr]
    assert last.response.id == created.response.id  # type: ignore[union-attr]


async def test_a_stream_that_stops_ends_completed(gateway: Gateway) -> None:
    async with client(gateway) as c:
        first = await c.responses.create(model=MODEL, input="hi", max_output_tokens=6)
        stop = first.output_text.split()[3]
        stream = await c.responses.create(
            model=MODEL, input="hi", max_output_tokens=6, stream=True, extra_body={"stop": [stop]}
        )
        events = [e async for e in stream]
    assert events[-1].type == "response.completed"
    assert events[-1].response.status == "completed"  # type: ignore[union-attr]
    assert events[-2].item.status == "completed"  # type: ignore[union-attr]
    assert stop not in events[-1].response.output_text  # type: ignore[union-attr]


async def test_cancel_a_streaming_response_frees_the_engine(gateway: Gateway) -> None:
    resp = await post(
        gateway,
        {"model": MODEL, "input": "x", "stream": True, "max_output_tokens": LONG},
        rid="str-1",
    )
    assert resp.headers["X-Request-Id"] == "str-1"
    response_id = await created_id(resp)
    assert response_id != "resp_str-1"  # the gateway's own, whatever the request's id
    await first_delta(resp)
    async with client(gateway) as c:
        cancelled = await c.responses.cancel(response_id)
        again = await c.responses.cancel(response_id)  # idempotent
    assert cancelled.status == "cancelled" and again.model_dump() == cancelled.model_dump()
    events = await events_of(resp)
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["status"] == "cancelled"
    assert "response.completed" not in [e["type"] for e in events]
    assert await gateway.in_flight() == {}
    assert gateway.cancellations("explicit", "decode") == 1
    assert gateway.requests("cancelled") == 1


async def test_cancel_a_synchronous_response_by_its_call(gateway: Gateway) -> None:
    """Its client learns its id only with the answer (as in OpenAI and vLLM, which cancel only
    background responses by id); the cancel API cancels its call, and the client gets the
    response so far, cancelled."""
    async with client(gateway) as c:
        made = asyncio.create_task(
            c.responses.create(
                model=MODEL,
                input="x",
                max_output_tokens=LONG,
                extra_headers={"X-Request-Id": "sync-1"},
            )
        )
        await wait_until(lambda: _decoding(gateway, "sync-1"), what="sync-1 decoding")
        status, body = await gateway.cancel("sync-1")
        answered = await made
        assert (await c.responses.cancel(answered.id)).status == "cancelled"  # ended: as it ended
    assert (status, body["state"]) == (200, "cancelled")
    assert answered.status == "cancelled" and answered.id != "resp_sync-1"
    assert 0 < len(answered.output_text.split()) < LONG
    assert await gateway.in_flight() == {}
    assert gateway.cancellations("explicit", "decode") == 1


async def test_the_cancel_api_and_the_response_cancel_are_one(gateway: Gateway) -> None:
    resp = await post(
        gateway,
        {"model": MODEL, "input": "x", "stream": True, "max_output_tokens": LONG},
        rid="one",
    )
    response_id = await created_id(resp)
    await first_delta(resp)
    status, body = await gateway.cancel("one")
    assert (status, body["state"]) == (200, "cancelled")
    assert (await events_of(resp))[-1]["response"]["status"] == "cancelled"
    async with client(gateway) as c:
        answered = await c.responses.cancel(response_id)  # ended: its final status
    assert answered.status == "cancelled"
    assert gateway.cancellations("explicit", "decode") == 1


async def test_hang_up_on_a_streaming_response_cancels_it(gateway: Gateway) -> None:
    resp = await post(
        gateway,
        {"model": MODEL, "input": "x", "stream": True, "max_output_tokens": LONG},
        rid="gone",
    )
    response_id = await created_id(resp)
    await first_delta(resp)
    resp.close()
    await wait_until(
        lambda: gateway.cancellations("client_disconnect", "decode") == 1,
        what="the hang-up counted",
    )
    assert await gateway.in_flight() == {}
    async with client(gateway) as c:
        kept = await c.responses.retrieve(response_id)
    assert kept.status == "cancelled"


async def test_background_outlives_its_client_and_only_its_cancel_stops_it() -> None:
    async with running_gateway(sim=ONE_SLOT) as gw, client(gw) as c:
        made = await c.responses.create(
            model=MODEL, input="x", max_output_tokens=LONG, background=True
        )
        assert made.status in ("queued", "in_progress") and made.background
        work = made.id.removeprefix("resp_")
        resumed = await gw.session.get(
            f"{gw.url}/v1/responses/{made.id}?stream=true", headers={"X-Request-Id": "get-1"}
        )
        await first_delta(resumed)
        resumed.close()  # a client leaving a resumed stream: the response goes on
        status, _ = await gw.cancel("get-1", reason="client_disconnect")  # as the proxy would
        assert status == 404  # the GET's call id holds no engine request
        await wait_until(lambda: _tokens(gw, work, 20), what="the background to go on")
        assert (await c.responses.retrieve(made.id)).status == "in_progress"
        cancelled = await c.responses.cancel(made.id)
        assert cancelled.status == "cancelled" and cancelled.output_text
        assert await gw.in_flight() == {}
        assert gw.cancellations("explicit", "decode") == 1
        assert gw.cancellations("client_disconnect", "decode") == 0


async def test_background_stream_resumes_after_a_sequence_number() -> None:
    async with running_gateway(sim=SimConfig(step_base_s=0.001)) as gw, client(gw) as c:
        made = await c.responses.create(
            model=MODEL, input="x", max_output_tokens=5, background=True
        )
        whole = [e async for e in await c.responses.retrieve(made.id, stream=True)]
        tail = [e async for e in await c.responses.retrieve(made.id, stream=True, starting_after=4)]
        for bad in ("--1", "x", "-2"):
            url = f"{gw.url}/v1/responses/{made.id}?stream=true&starting_after={bad}"
            async with gw.session.get(url) as resp:
                assert resp.status == 400
                assert (await resp.json())["error"]["param"] == "starting_after"
    assert [e.sequence_number for e in whole] == list(range(len(whole)))
    assert whole[0].type == "response.created" and whole[0].response.status == "queued"  # type: ignore[union-attr]
    assert whole[1].type == "response.queued" and whole[2].type == "response.in_progress"
    assert whole[-1].type == "response.incomplete"
    assert [e.model_dump() for e in tail] == [e.model_dump() for e in whole[5:]]


async def test_defaults_spelled_out_are_accepted(gateway: Gateway) -> None:
    async with client(gateway) as c:
        made = await c.responses.create(
            model=MODEL,
            input=[{"role": "user", "content": [{"type": "input_text", "text": "x"}]}],
            instructions="be brief",
            text={"format": {"type": "text"}},
            truncation="disabled",
            tool_choice="auto",
            tools=[],
            metadata={"k": "v"},
            max_output_tokens=2,
            temperature=0,
            top_p=1,
        )
    assert made.status == "incomplete" and made.metadata == {"k": "v"}
    assert made.instructions == "be brief" and made.temperature == 0


async def test_a_background_stream_replayed_is_the_stream_it_sent(gateway: Gateway) -> None:
    async with client(gateway) as c:
        stream = await c.responses.create(
            model=MODEL, input="x", max_output_tokens=12, background=True, stream=True
        )
        live = [e async for e in stream]
        response_id = live[0].response.id  # type: ignore[union-attr]
        again = [e async for e in await c.responses.retrieve(response_id, stream=True)]
    assert [e.type for e in live[:3]] == [
        "response.created",
        "response.queued",
        "response.in_progress",
    ]
    assert len([e for e in live if e.type == "response.output_text.delta"]) == 12
    assert [e.model_dump() for e in again] == [e.model_dump() for e in live]


async def test_delete_then_not_found(gateway: Gateway) -> None:
    async with client(gateway) as c:
        made = await c.responses.create(model=MODEL, input="x", max_output_tokens=2)
        await c.responses.delete(made.id)
        with pytest.raises(openai.NotFoundError):
            await c.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError):
            await c.responses.cancel("resp_never-seen")


async def test_store_false_is_not_retrievable(gateway: Gateway) -> None:
    async with client(gateway) as c:
        made = await c.responses.create(model=MODEL, input="x", max_output_tokens=2, store=False)
        with pytest.raises(openai.NotFoundError):
            await c.responses.retrieve(made.id)
        with pytest.raises(openai.BadRequestError, match="'background' needs 'store'"):
            await c.responses.create(model=MODEL, input="x", background=True, store=False)


async def test_previous_response_id_continues_the_conversation(gateway: Gateway) -> None:
    async with client(gateway) as c:
        first = await c.responses.create(model=MODEL, input="one", max_output_tokens=3)
        second = await c.responses.create(
            model=MODEL, input="two", max_output_tokens=3, previous_response_id=first.id
        )
        chat = await c.chat.completions.create(
            model=MODEL,
            max_tokens=3,
            messages=[
                {"role": "user", "content": "one"},
                {"role": "assistant", "content": first.output_text},
                {"role": "user", "content": "two"},
            ],
        )
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens == chat.usage.prompt_tokens  # type: ignore[union-attr]
    assert second.output_text == chat.choices[0].message.content


async def test_the_store_is_bounded_by_count_and_age() -> None:
    async with running_gateway(responses_max_stored=2) as gw, client(gw) as c:
        made = [
            await c.responses.create(model=MODEL, input="x", max_output_tokens=1) for _ in range(3)
        ]
        with pytest.raises(openai.NotFoundError):
            await c.responses.retrieve(made[0].id)  # the oldest went
        assert (await c.responses.retrieve(made[2].id)).id == made[2].id
    async with running_gateway(responses_ttl=0.0) as gw, client(gw) as c:
        made0 = await c.responses.create(model=MODEL, input="x", max_output_tokens=1)
        with pytest.raises(openai.NotFoundError):
            await c.responses.retrieve(made0.id)


async def test_background_responses_in_flight_are_bounded() -> None:
    async with running_gateway(sim=ONE_SLOT, responses_max_stored=1) as gw, client(gw) as c:
        held = await c.responses.create(
            model=MODEL, input="x", max_output_tokens=LONG, background=True
        )
        with pytest.raises(openai.RateLimitError, match="background responses are in flight"):
            await c.responses.create(model=MODEL, input="x", background=True)
        await c.responses.cancel(held.id)


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools", "'tools' (tools in the Responses API)"),
        ({"reasoning": {"effort": "low"}}, "reasoning", "'reasoning' (reasoning)"),
        ({"frobnicate": 1}, "frobnicate", "'frobnicate' is not a field this endpoint knows"),
        ({"input": [{"type": "function_call_output"}]}, "input", "only message items"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input",
            "only text parts",
        ),
        ({"metadata": {"k": "v" * 513}}, "metadata", "string values of up to 512"),
        ({"max_output_tokens": 0}, "max_output_tokens", "'max_output_tokens' must be between"),
        (
            {"text": {"format": {"type": "json_object"}}},
            "text",
            "'text' is not supported by the simulated engine",
        ),
        ({"previous_response_id": "resp_nope"}, "previous_response_id", "no stored response"),
    ],
)
async def test_refused_by_name(
    gateway: Gateway, body: dict[str, Any], param: str, words: str
) -> None:
    resp = await post(gateway, {"model": MODEL, "input": "x", **body})
    error = (await resp.json())["error"]
    assert resp.status in (400, 404) and error["param"] == param
    assert words in error["message"]
    assert gateway.requests("rejected") == 1


async def _decoding(gw: Gateway, rid: str) -> bool:
    return (await gw.phase_of(rid)) == "decode"


async def _tokens(gw: Gateway, rid: str, at_least: int) -> bool:
    entry = (await gw.in_flight()).get(rid)
    return entry is not None and entry["generated_tokens"] >= at_least


async def test_a_response_cancel_reaches_another_api_process(tmp_path: Path) -> None:
    async with running_api_processes(tmp_path, 2, sim=SimConfig(step_base_s=0.005)) as gws:
        runs, other = gws
        resp = await post(
            runs,
            {"model": MODEL, "input": "x", "stream": True, "max_output_tokens": LONG},
            rid="far",
        )
        response_id = await created_id(resp)
        await first_delta(resp)
        async with client(other) as c:
            answered = await c.responses.cancel(response_id)  # asked of the process holding it
            fetched = await c.responses.retrieve(response_id)  # asked of it too
        assert answered.status == "cancelled" and answered.id == response_id
        assert fetched.status == "cancelled" and fetched.output_text == answered.output_text
        assert answered.output_text  # the whole object, from the process that ran it
        assert (await events_of(resp))[-1]["response"]["status"] == "cancelled"
        assert await runs.in_flight() == {}


async def _events(gw: Gateway, response_id: str, after: int = -1) -> list[bytes]:
    """A background response's events as ``GET ...?stream=true`` relays them, each whole."""
    url = f"{gw.url}/v1/responses/{response_id}?stream=true&starting_after={after}"
    async with gw.session.get(url) as resp:
        assert resp.status == 200, await resp.text()
        return (await resp.read()).split(b"\n\n")[:-1]


async def test_a_response_is_read_deleted_and_continued_from_another_api_process(
    tmp_path: Path,
) -> None:
    """Was: only the cancel reached the process holding a response; GET, DELETE and
    previous_response_id answered 404 on the other process, and so did a resumed stream."""
    async with running_api_processes(tmp_path, 2, sim=SimConfig(step_base_s=0.002)) as gws:
        runs, other = gws
        async with client(runs) as here, client(other) as there:
            first = await here.responses.create(model=MODEL, input="x", max_output_tokens=5)
            fetched = await there.responses.retrieve(first.id)
            assert (fetched.id, fetched.output_text) == (first.id, first.output_text)
            second = await there.responses.create(
                model=MODEL, input="more", previous_response_id=first.id, max_output_tokens=5
            )
            continued = await here.responses.create(
                model=MODEL, input=[*_turns(first), {"role": "user", "content": "more"}],
                max_output_tokens=5,
            )  # fmt: skip
            assert second.output_text == continued.output_text  # the first's turns, continued
            running = await here.responses.create(
                model=MODEL, input="x", max_output_tokens=LONG, background=True
            )
            with pytest.raises(openai.BadRequestError, match="cancel it before deleting it"):
                await there.responses.delete(running.id)
            await there.responses.cancel(running.id)
            await there.responses.delete(first.id)
            for c in (here, there):
                with pytest.raises(openai.NotFoundError):
                    await c.responses.retrieve(first.id)
                with pytest.raises(openai.NotFoundError):
                    await c.responses.create(model=MODEL, input="x", previous_response_id=first.id)


def _turns(response: Any) -> list[dict[str, str]]:
    return [{"role": "user", "content": "x"},
            {"role": "assistant", "content": response.output_text}]  # fmt: skip


async def test_a_background_stream_resumes_from_another_api_process(tmp_path: Path) -> None:
    """Followed live from the other process, page by page over the sibling channel, and
    replayed from any sequence number: the events the response emitted, byte for byte."""
    async with running_api_processes(tmp_path, 2, sim=SimConfig(step_base_s=0.005)) as gws:
        runs, other = gws
        body = {"model": MODEL, "input": "x", "max_output_tokens": 300, "background": True}
        made = await (await post(runs, body)).json()
        live = await _events(other, made["id"])  # from its start, while it runs
        last = json.loads(live[-1].split(b"data: ", 1)[1])
        assert last["type"] == "response.incomplete"  # max_output_tokens: not cut short
        assert last["response"]["usage"]["output_tokens"] == 300 and len(live) > 100
        assert await _events(runs, made["id"]) == live  # the home's replay: the same bytes
        assert await _events(other, made["id"], after=60) == live[61:]
        sync = await post(runs, {"model": MODEL, "input": "x", "max_output_tokens": 1})
        answer = await sync.json()
        url = f"{other.url}/v1/responses/{answer['id']}?stream=true"
        async with other.session.get(url) as resp:
            assert resp.status == 400, await resp.text()
            assert "only background responses" in (await resp.json())["error"]["message"]


async def test_shutdown_cancels_a_background_response_after_the_drain() -> None:
    async with running_gateway(drain_timeout=0.0) as gw, client(gw) as c:
        made = await c.responses.create(
            model=MODEL, input="x", max_output_tokens=LONG, background=True
        )
        work = made.id.removeprefix("resp_")
        await wait_until(lambda: _tokens(gw, work, 1), what="the background response decoding")
    assert gw.cancellations("shutdown", "decode") == 1
    assert gw.requests("cancelled") == 1


async def test_a_draining_gateway_refuses_a_background_response(gateway: Gateway) -> None:
    assert gateway.server.service is not None
    gateway.server.service.draining = True
    resp = await post(gateway, {"model": MODEL, "input": "x", "background": True})
    assert resp.status == 503
    assert "shutting down" in (await resp.json())["error"]["message"]
    gateway.server.service.draining = False
    assert len(gateway.server.service.registry) == 0
