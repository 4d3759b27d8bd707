"""The OpenAI API's rule with the simulated engine: every field honoured or refused by name.

A refusal is a 400 in OpenAI's error shape whose ``param`` and message name the field; unknown
fields are refused, metadata is accepted and changes nothing, values that ask for nothing are
accepted. What the simulation honours changes its text, the same way every time; what it cannot
do honestly (penalties, prompt log-probabilities) it refuses by name.
"""

from __future__ import annotations

import math
from typing import Any

import aiohttp
import openai
import pytest

from bench.base.waiting import wait_until
from gateway_server.engine.sim.sampling import VOCAB
from gateway_server.openai.fields import CHAT, COMPLETIONS, Use
from tests.support.gateway import MODEL, Gateway

CHAT_PATH, COMPLETIONS_PATH = "/v1/chat/completions", "/v1/completions"
MESSAGES = [{"role": "user", "content": "tell me"}]
ASKS = {"ask": "for something"}
"""A value no rule calls "off": asks for the field's feature."""


def _base(path: str) -> dict[str, Any]:
    if path == CHAT_PATH:
        return {"model": MODEL, "messages": MESSAGES, "max_tokens": 8}
    return {"model": MODEL, "prompt": "tell me", "max_tokens": 8}


async def post(gw: Gateway, path: str, **fields: Any) -> tuple[int, dict[str, Any]]:
    async with gw.session.post(gw.url + path, json=_base(path) | fields) as resp:
        return resp.status, await resp.json()


async def text_of(gw: Gateway, path: str = COMPLETIONS_PATH, **fields: Any) -> str:
    status, body = await post(gw, path, **fields)
    assert status == 200, body
    choice = body["choices"][0]
    return str(choice["message"]["content"] if path == CHAT_PATH else choice["text"])


def _refused(table: Any) -> list[str]:
    return sorted(name for name, rule in table.items() if rule.use is Use.REFUSED)


@pytest.mark.parametrize(
    ("path", "name"),
    [(CHAT_PATH, n) for n in _refused(CHAT)]
    + [(COMPLETIONS_PATH, n) for n in _refused(COMPLETIONS)],
)
async def test_every_refused_field_is_a_400_naming_it(
    gateway: Gateway, path: str, name: str
) -> None:
    status, body = await post(gateway, path, **{name: ASKS})
    assert status == 400
    error = body["error"]
    assert error["param"] == name and error["message"].startswith(f"'{name}' ")
    assert error["type"] == "invalid_request_error" and error["code"] == 400


@pytest.mark.parametrize(
    ("path", "name", "value", "why"),
    [
        (
            CHAT_PATH,
            "tools",
            [{"type": "function", "function": {"name": "f"}}],
            "not supported by the simulated engine",
        ),
        (
            CHAT_PATH,
            "response_format",
            {"type": "json_object"},
            "not supported by the simulated engine",
        ),
        (COMPLETIONS_PATH, "suffix", "and then", "fill-in-the-middle"),
        (CHAT_PATH, "presence_penalty", 0.5, "not supported by the simulated engine"),
        (COMPLETIONS_PATH, "frequency_penalty", 0.3, "not supported by the simulated engine"),
        (COMPLETIONS_PATH, "repetition_penalty", 1.2, "not supported by the simulated engine"),
        (CHAT_PATH, "frobnicate", 1, "not a field this endpoint knows"),
        (COMPLETIONS_PATH, "guided_json", {"type": "object"}, "use 'structured_outputs'"),
        (CHAT_PATH, "functions", [{"name": "f"}], "use 'tools'"),
    ],
)
async def test_what_the_gateway_cannot_honour_is_refused_and_says_why(
    gateway: Gateway, path: str, name: str, value: Any, why: str
) -> None:
    status, body = await post(gateway, path, **{name: value})
    assert status == 400
    assert body["error"]["param"] == name and why in body["error"]["message"]
    assert gateway.requests("rejected") == 1 and gateway.requests("completed") == 0


async def test_metadata_and_values_that_ask_for_nothing_change_nothing(gateway: Gateway) -> None:
    plain = await text_of(gateway, CHAT_PATH)
    extras = {"user": "u-1", "metadata": {"k": "v"}, "store": False, "service_tier": "auto",
              "parallel_tool_calls": True, "tool_choice": "none", "logprobs": False,
              "response_format": {"type": "text"}, "presence_penalty": 0, "top_k": -1,
              "echo": False, "logit_bias": {}, "top_logprobs": None}  # fmt: skip
    assert await text_of(gateway, CHAT_PATH, **extras) == plain


async def test_unknown_paths_under_v1_are_openai_errors(gateway: Gateway) -> None:
    async with gateway.session.post(gateway.url + "/v1/embeddings", json={}) as resp:
        assert resp.status == 404
        error = (await resp.json())["error"]
    assert "/v1/embeddings" in error["message"] and error["code"] == 404 and error["type"]
    async with gateway.session.get(gateway.url + COMPLETIONS_PATH) as resp:
        assert resp.status == 405
        assert "GET" in (await resp.json())["error"]["message"]


async def test_sampling_knobs_change_the_text_the_same_way_every_time(gateway: Gateway) -> None:
    seeded = {"seed": 7, "max_tokens": 24}
    base = await text_of(gateway, **seeded)
    greedy = await text_of(gateway, **seeded, temperature=0)
    assert greedy == await text_of(gateway, **seeded, temperature=0)
    assert base != greedy  # at temperature 1 the draws wander off the most likely word
    # Keeping only the most likely word is greedy decoding, however it is asked for.
    assert await text_of(gateway, **seeded, top_k=1) == greedy
    assert await text_of(gateway, **seeded, min_p=1.0) == greedy
    assert await text_of(gateway, **seeded, top_p=1e-9) == greedy
    for knob in ({"top_k": 3}, {"top_p": 0.5}, {"temperature": 0.3}, {"min_p": 0.2}):
        changed = await text_of(gateway, **seeded, **knob)
        assert changed == await text_of(gateway, **seeded, **knob), knob
    fox = VOCAB.index("fox")
    biased = await text_of(gateway, **seeded, logit_bias={str(fox): 100})
    assert biased.split() == ["fox"] * 24


async def test_stop_token_ids_min_tokens_and_stop_strings(gateway: Gateway) -> None:
    words = (await text_of(gateway, seed=3, max_tokens=40)).split()
    stop_word = words[5]
    first = words.index(stop_word)
    status, body = await post(gateway, COMPLETIONS_PATH, seed=3, max_tokens=40,
                              stop_token_ids=[VOCAB.index(stop_word)])  # fmt: skip
    assert status == 200
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["choices"][0]["text"].split() == words[: first + 1]  # the stop token is kept
    later = await text_of(gateway, seed=3, max_tokens=40, min_tokens=first + 1,
                          stop_token_ids=[VOCAB.index(stop_word)])  # fmt: skip
    assert len(later.split()) > first + 1
    stop = f" {stop_word}"
    cut = await text_of(gateway, seed=3, max_tokens=40, stop=[stop])
    kept = await text_of(gateway, seed=3, max_tokens=40, stop=[stop],
                         include_stop_str_in_output=True)  # fmt: skip
    assert kept == cut + stop


async def test_n_with_a_seed_draws_each_choice_with_its_own_seed(gateway: Gateway) -> None:
    status, body = await post(gateway, COMPLETIONS_PATH, n=3, seed=11, max_tokens=12)
    assert status == 200
    texts = [c["text"] for c in sorted(body["choices"], key=lambda c: c["index"])]
    assert len(set(texts)) == 3  # as vLLM: choice i draws with seed + i
    assert texts == [await text_of(gateway, seed=11 + i, max_tokens=12) for i in range(3)]


async def test_chat_logprobs_streamed_and_not(gateway: Gateway) -> None:
    ask = {"logprobs": True, "top_logprobs": 3, "seed": 5, "max_tokens": 10}
    status, body = await post(gateway, CHAT_PATH, **ask)
    assert status == 200
    choice = body["choices"][0]
    content = choice["logprobs"]["content"]
    assert "".join(t["token"] for t in content) == choice["message"]["content"]
    assert len(content) == body["usage"]["completion_tokens"] == 10
    for entry in content:
        assert entry["logprob"] <= 0 and entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 3
        assert math.fsum(math.exp(t["logprob"]) for t in entry["top_logprobs"]) <= 1 + 1e-9
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="-", max_retries=0) as c:
        stream = await c.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True,  # type: ignore[arg-type]
                                                 logprobs=True, top_logprobs=3, seed=5,
                                                 max_tokens=10)  # fmt: skip
        streamed = [
            t.model_dump()
            async for chunk in stream
            for t in (chunk.choices[0].logprobs.content or [] if chunk.choices[0].logprobs else [])
        ]
    assert streamed == content


async def test_completion_logprobs_and_echo(gateway: Gateway) -> None:
    status, body = await post(gateway, COMPLETIONS_PATH, logprobs=2, seed=5, max_tokens=6)
    assert status == 200
    choice = body["choices"][0]
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert logprobs["text_offset"][0] == 0
    for offset, token, nxt in zip(logprobs["text_offset"], logprobs["tokens"],
                                  logprobs["text_offset"][1:], strict=False):  # fmt: skip
        assert nxt == offset + len(token)
    assert all(1 <= len(top) <= 3 and token in top for token, top in
               zip(logprobs["tokens"], logprobs["top_logprobs"], strict=True))  # fmt: skip
    echoed = await text_of(gateway, echo=True, seed=5, max_tokens=6)
    assert echoed == "tell me" + choice["text"]
    status, body = await post(gateway, COMPLETIONS_PATH, echo=True, logprobs=1)
    assert status == 400 and body["error"]["param"] == "echo"
    assert "not supported by the simulated engine" in body["error"]["message"]


async def test_prompts_as_token_ids(gateway: Gateway) -> None:
    status, body = await post(gateway, COMPLETIONS_PATH, prompt=[[0, 1, 2], [3]], echo=True,
                              max_tokens=2)  # fmt: skip
    assert status == 200
    texts = [c["text"] for c in sorted(body["choices"], key=lambda c: c["index"])]
    assert texts[0].startswith("the quick brown") and texts[1].startswith("fox")
    assert body["usage"]["prompt_tokens"] == 4
    status, body = await post(gateway, COMPLETIONS_PATH, prompt=[0, len(VOCAB)])
    assert status == 400 and body["error"]["param"] == "prompt"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logit_bias": {"99999": 1}}, "logit_bias"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"min_tokens": 9}, "min_tokens"),
        ({"top_k": -2}, "top_k"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"add_generation_prompt": True, "continue_final_message": True}, "continue_final_message"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages",
        ),
        ({"messages": [{"role": "user", "content": "x", "colour": "red"}]}, "messages"),
    ],
)
async def test_bad_values_are_refused_by_name(
    gateway: Gateway, fields: dict[str, Any], param: str
) -> None:
    status, body = await post(gateway, CHAT_PATH, **fields)
    assert status == 400 and body["error"]["param"] == param, body


async def test_chat_prompt_options(gateway: Gateway) -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    history = [{"role": "system", "content": parts},
               {"role": "user", "content": "hi", "name": "ann"},
               {"role": "assistant", "content": None,
                "tool_calls": [{"id": "c1", "type": "function",
                                "function": {"name": "f", "arguments": "{}"}}]},
               {"role": "tool", "content": "42", "tool_call_id": "c1"},
               {"role": "assistant", "content": "so"}]  # fmt: skip
    usage = {}
    for options in ({}, {"add_generation_prompt": False},
                    {"add_generation_prompt": False, "continue_final_message": True},
                    {"chat_template_kwargs": {"enable_thinking": False}}):  # fmt: skip
        status, body = await post(gateway, CHAT_PATH, messages=history, **options)
        assert status == 200, body
        usage[str(options)] = body["usage"]["prompt_tokens"]
    # "a\nb" joined by a newline, as vLLM joins text parts; no generation prompt, one word less.
    assert usage["{}"] == usage["{'add_generation_prompt': False}"] + 1
    assert usage[str({"chat_template_kwargs": {"enable_thinking": False}})] == usage["{}"]


async def test_a_hang_up_mid_stream_with_logprobs_is_a_cancellation(gateway: Gateway) -> None:
    async with aiohttp.ClientSession() as client:
        body = _base(CHAT_PATH) | {"max_tokens": 4000, "stream": True, "logprobs": True,
                                   "top_logprobs": 5}  # fmt: skip
        resp = await client.post(gateway.url + CHAT_PATH, json=body,
                                  headers={"X-Request-Id": "gone-lp"})  # fmt: skip
        while b'"top_logprobs"' not in await resp.content.readline():
            pass  # the role event first, then tokens with their log-probabilities
        resp.close()  # the client hangs up mid-stream
    await wait_until(
        lambda: gateway.cancellations("client_disconnect", "decode") == 1, what="the abort"
    )
    assert await gateway.in_flight() == {}
    assert gateway.server.pool.workers[0].engine.load().running == 0
