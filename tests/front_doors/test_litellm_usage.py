"""A billing front door records a cancelled call's tokens: LiteLLM as it comes (``.venv-litellm``,
what ``make test`` installs) in front of hangup's gateway, with no database.

LiteLLM's spend logs are rows in Postgres; without a database its proxy still computes, for
every call, the ``standard_logging_object`` those rows are made from (``prompt_tokens``,
``completion_tokens``, ``response_cost``, ``status``) and hands it to its callbacks, success or
failure. A callback of LiteLLM's own kind (``CustomLogger``, registered under
``litellm_settings.callbacks`` next to the configuration) writes each one to a file here: what
the spend log would hold, minus the database.

A stream the gateway cancels (here by id, as a job's cancel or an edge's cancel pool does) ends
with the usage chunk LiteLLM asked for (its proxy adds ``stream_options.include_usage``) and
the error event; LiteLLM logs a failure and bills the partial usage it recovers from the
chunks it read: the gateway's own counts. Before the gateway sent usage, LiteLLM billed its own
estimate (its tokenizer on the messages and the text read), not what the engine used. Skips
without LiteLLM.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.base.addresses import port_of
from bench.base.processes import Process, spawn
from bench.base.waiting import wait_until
from bench.harness.front_doors import LITELLM, MODEL, running_front_door

pytestmark = pytest.mark.slow

PROMPT_PRICE, COMPLETION_PRICE = 0.001, 0.002  # dollars a token, given to LiteLLM per model
CALLBACK = '''
"""Each call's standard logging payload, as LiteLLM would write it to its spend log."""
import json
import os

from litellm.integrations.custom_logger import CustomLogger

FIELDS = ("status", "prompt_tokens", "completion_tokens", "total_tokens", "response_cost")
PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spend.jsonl")


class SpendFile(CustomLogger):
    def _write(self, kwargs):
        payload = kwargs.get("standard_logging_object") or {}
        with open(PATH, "a") as out:
            out.write(json.dumps({k: payload.get(k) for k in FIELDS}, default=str) + "\\n")

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        self._write(kwargs)

    async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):
        self._write(kwargs)


handler = SpendFile()
'''


@dataclass
class Billing:
    gateway: Process
    litellm: str
    spend: Path

    def ended(self, call_id: str) -> dict[str, Any] | None:
        """The gateway's ``request_end`` line of ``call_id``, once written."""
        for text in self.gateway.log().splitlines():
            record = json.loads(text)
            if record["msg"] == "request_end" and record.get("call_id") == call_id:
                return dict(record)
        return None

    def records(self) -> list[dict[str, Any]]:
        if not self.spend.exists():
            return []
        return [json.loads(line) for line in self.spend.read_text().splitlines() if line]


def _with_callback_and_prices(text: str) -> str:
    """The shipped configuration with the callback, and one model entry with prices."""
    callback = "litellm_settings:\n  callbacks: spend_file.handler\n"
    text = text.replace("litellm_settings:\n", callback)
    entry = (
        f"  - model_name: {MODEL}\n    litellm_params:\n      model: openai/{MODEL}\n"
        "      api_base: http://127.0.0.1:@UPSTREAM_PORT@/v1\n      api_key: none\n"
        f"      input_cost_per_token: {PROMPT_PRICE}\n"
        f"      output_cost_per_token: {COMPLETION_PRICE}"
    )
    return text.replace("@MODELS@", entry)


@pytest.fixture(scope="module")
def billing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Billing]:
    if not LITELLM.exists():
        pytest.skip(f"no {LITELLM}: `make test` installs LiteLLM there")
    work = tmp_path_factory.mktemp("litellm-billing")
    gateway_args = ["--http-port", "0", "--grpc-port", "0", "--sim-step-base", "0.01"]
    with spawn("gateway_server", gateway_args, work / "gateway") as gateway:
        door = work / "litellm"
        door.mkdir()
        (door / "spend_file.py").write_text(CALLBACK)
        port = port_of(gateway.url())
        with running_front_door("litellm", door, port, _with_callback_and_prices) as url:
            yield Billing(gateway, url, door / "spend.jsonl")


async def test_litellm_bills_a_stream_the_gateway_cancelled_with_the_gateways_counts(
    billing: Billing,
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "one two three four"}],
            "max_tokens": 3000, "stream": True}  # fmt: skip
    known = len(billing.records())
    url = f"{billing.litellm}/v1/chat/completions"
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers={"X-Request-Id": "bill-1"}) as resp,
    ):
        assert resp.status == 200, await resp.text()
        for _ in range(8):  # a few chunks through LiteLLM: the call is generating
            await resp.content.readline()
        cancel = f"{billing.gateway.url()}/v2/requests/bill-1/cancel"
        async with session.post(cancel) as answered:
            assert (await answered.json())["state"] == "cancelled"
        await asyncio.wait_for(resp.content.read(), 30)  # LiteLLM ends its client's stream

    def billed() -> dict[str, Any] | None:
        return next(iter(billing.records()[known:]), None)

    record = await wait_until(billed, 30, "LiteLLM's log of the call")
    line = await wait_until(lambda: billing.ended("bill-1"), 10, "the gateway's request_end")
    used = (line["prompt_tokens"], line["generated_tokens"])  # what the engine used
    assert line["outcome"] == "cancelled" and used[1] >= 3, line
    assert record["status"] == "failure"  # cut, not completed: yet billed what it used
    assert (record["prompt_tokens"], record["completion_tokens"]) == used, (record, line)
    cost = used[0] * PROMPT_PRICE + used[1] * COMPLETION_PRICE
    assert record["response_cost"] == pytest.approx(cost)
