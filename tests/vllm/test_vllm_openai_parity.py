"""The gateway against ``vllm serve``, request by request (tests/support/openai_parity.py): the
same tiny model and engine options, a battery of chat, completions and Responses requests (every
field the gateway honours, streamed and not, valid and invalid) sent to both by raw HTTP, and some
through the ``openai`` client. With temperature 0 or a seed both give the same text, finish reason,
token counts and log-probabilities (within 1e-3); what both refuse is refused by both; what the
gateway refuses it refuses by name, never answering 200 without the feature.

The outcome, case by case, is docs/openai-parity.md; the test fails when the document no longer
says what happened (``HANGUP_WRITE_PARITY=1`` rewrites it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import openai
import pytest

from bench.base.processes import REPO, Process
from bench.harness.vllm_stack import MODEL, vllm_serve
from tests.support.openai_parity import (
    CASES,
    CHAT,
    HELLO,
    PROMPT,
    RESPONSES,
    TOOL,
    Case,
    Reading,
    close,
)
from tests.support.openai_parity import differences as differences_of
from tests.support.openai_parity import read as read_answer
from tests.support.vllm_fixtures import OpenAIFor, requires_vllm

# The first test here waits for vllm serve and, unless another module started it, the shared
# gateway: two engine starts, minutes each on a loaded CPU.
pytestmark = [pytest.mark.vllm, requires_vllm, pytest.mark.timeout(1200)]

DOC = REPO / "docs" / "openai-parity.md"
TABLE_START, TABLE_END = "<!-- parity table: start -->", "<!-- parity table: end -->"


@pytest.fixture(scope="module")
def served(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with vllm_serve(tiny_model, tmp_path_factory.mktemp("vllm-serve-parity")) as url:
        yield url


def test_the_battery_is_large_and_covers_every_endpoint() -> None:
    assert len(CASES) >= 40
    assert {c.path for c in CASES} == {CHAT, "/v1/completions", RESPONSES}
    assert any(c.body.get("stream") for c in CASES if c.expect == "same")
    assert {c.expect for c in CASES} == {"same", "both_refuse", "gateway_refuses"}


KSERVE_SAMPLING = [
    {"max_tokens": 8, "temperature": 0},
    {"max_tokens": 8, "seed": 11, "temperature": 1.0, "top_k": 5, "min_p": 0.05},
    {"max_tokens": 8, "seed": 3, "temperature": 0.8, "top_p": 0.9, "presence_penalty": 1.5,
     "frequency_penalty": 0.5, "repetition_penalty": 1.3},
    {"max_tokens": 8, "temperature": 0, "logit_bias": {"100": 100}, "min_tokens": 8},
    {"max_tokens": 12, "temperature": 0, "stop_token_ids": [100], "ignore_eos": True},
]  # fmt: skip
"""Sampling fields KServe once accepted and ignored, each seeded or greedy."""


@pytest.mark.parametrize("sampling", KSERVE_SAMPLING, ids=lambda s: ",".join(sorted(s)))
async def test_kserve_sampling_answers_as_vllm_serve_answers_it(
    served: str, gateway: Process, sampling: dict[str, object]
) -> None:
    """The oracle for KServe's sampling fields: ``vllm serve``'s completion of the same prompt
    with the same fields; the gateway's ``generate`` reads them from ``parameters`` and from
    ``sampling_parameters`` alike."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        body = {"model": MODEL, "prompt": "Hello there", **sampling}
        async with session.post(f"{served}/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            expected = (await resp.json())["choices"][0]["text"]
        for where in ("parameters", "sampling_parameters"):
            given = {"text_input": "Hello there", "exclude_input_in_output": True, where: sampling}
            url = f"{gateway.url()}/v2/models/{MODEL}/generate"
            async with session.post(url, json=given) as resp:
                assert resp.status == 200, await resp.text()
                assert (await resp.json())["text_output"] == expected, where


async def test_each_request_is_answered_as_vllm_serve_answers_it(
    served: str, gateway: Process
) -> None:
    rows, failures = [], []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        for case in CASES:
            theirs = await read_answer(session, served, case, MODEL)
            ours = await read_answer(session, gateway.url(), case, MODEL)
            verdict, problem = judge(case, theirs, ours)
            rows.append(_row(case, theirs, verdict))
            if problem:
                failures.append(f"{case.path} {case.name}: {problem}")
    assert not failures, "\n".join(failures)
    table = "\n".join(["| endpoint | request | vllm serve | gateway |", "|---|---|---|---|", *rows])
    if os.environ.get("HANGUP_WRITE_PARITY"):
        _write_table(table)
    assert table in DOC.read_text(), f"{DOC} is out of date: run with HANGUP_WRITE_PARITY=1"


def judge(case: Case, theirs: Reading, ours: Reading) -> tuple[str, str]:
    """The gateway's column of the table, and what is wrong ("" when nothing)."""
    streamed = case.path == RESPONSES and case.body.get("stream") and ours.status == 200
    if streamed and not ours.terminal:
        return "", "the gateway's stream ended without a final event"
    if case.expect == "same":
        found = differences_of(theirs, ours)
        if not found and theirs.terminal != ours.terminal:
            return _terminal_difference(theirs, ours)
        return "same answer", "; ".join(found)
    if case.expect == "both_refuse":
        ok = theirs.status == 400 and ours.status == 400 and ours.error is not None
        return "400, as vllm serve", "" if ok else f"{theirs.status} / {ours.status}"
    error = ours.error or {}
    if ours.status != 400 or error.get("param") != case.field:
        return "", f"the gateway answered {ours.status} {error} (expected 400 naming {case.field})"
    return f"400: {error['message']}", ""


def _terminal_difference(theirs: Reading, ours: Reading) -> tuple[str, str]:
    """The one known difference: a streamed response cut by ``max_output_tokens`` ends with
    OpenAI's ``response.incomplete`` event on the gateway, with ``response.completed`` (its
    response's status ``incomplete``) on vllm serve. Any other is a failure."""
    verdict = f"same answer; the stream ends with {ours.terminal} (vllm serve: {theirs.terminal})"
    status = theirs.choices[0]["finish"]
    known = (theirs.terminal, ours.terminal) == ("response.completed", "response.incomplete")
    ok = known and str(status).startswith("incomplete")
    return verdict, "" if ok else f"ended by {theirs.terminal} vs {ours.terminal} ({status})"


def _row(case: Case, theirs: Reading, verdict: str) -> str:
    endpoint = {CHAT: "chat", RESPONSES: "responses"}.get(case.path, "completions")
    vllm = "200" if theirs.status == 200 else f"{theirs.status}"
    return f"| {endpoint} | {case.name} | {vllm} | {verdict.replace('|', '/')} |"


def _write_table(table: str) -> None:
    text = DOC.read_text()
    head, rest = text.split(TABLE_START)
    _, tail = rest.split(TABLE_END)
    DOC.write_text(f"{head}{TABLE_START}\n{table}\n{TABLE_END}{tail}")


async def test_through_the_openai_client(
    served: str, gateway: Process, client_for: OpenAIFor
) -> None:
    """What an application using the ``openai`` package reads is the same from both."""
    theirs = openai.OpenAI(base_url=served + "/v1", api_key="unused", max_retries=0)
    ours = client_for(gateway)
    try:
        for api in (theirs, ours):
            assert api.models.list().data[0].id == MODEL
        chats = [
            api.chat.completions.create(
                model=MODEL,
                messages=HELLO,
                max_tokens=6,
                seed=3,
                logprobs=True,
                top_logprobs=3,
                n=2,
            )
            for api in (theirs, ours)
        ]
        dumps = [
            [(c.index, c.message.content, c.finish_reason, c.logprobs and c.logprobs.model_dump())
             for c in chat.choices]
            for chat in chats
        ]  # fmt: skip
        assert close(dumps[0], dumps[1]), dumps
        assert chats[1].choices[0].message.content != chats[1].choices[1].message.content
        assert chats[0].usage == chats[1].usage
        texts = []
        for api in (theirs, ours):
            stream = api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, echo=True,
                                            temperature=0, stream=True)  # fmt: skip
            texts.append("".join(c.choices[0].text for c in stream if c.choices))
        assert texts[0] == texts[1] and texts[0].startswith(PROMPT)
        for api in (theirs, ours):  # neither has a tool-call parser: both refuse as vLLM does
            with pytest.raises(openai.BadRequestError, match="requires --enable-auto-tool-choice"):
                api.chat.completions.create(model=MODEL, messages=HELLO, tools=[TOOL])  # type: ignore[arg-type, list-item]
    finally:
        theirs.close()
