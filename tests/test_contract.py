"""The contract between the proxy and the gateway (``hangup_contract``): one definition, used by
both, encoded and parsed the same way on both sides.

Pure checks of the codecs and the id rule, then the two sides talking over real sockets: the
proxy's cancel adapter cancels one request of a gRPC stream on the gateway by an alias full of
characters a URL path cannot carry as they are, and both sides refuse an id that breaks the rule.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import tritonclient.grpc.aio as triton
from tritonclient.utils import InferenceServerException

from hangup_contract import request_id
from hangup_contract.cancel import (
    CancelAnswer,
    cancel_path,
    encode_request,
    parse_request,
)
from hangup_contract.vocabulary import CancelState, Phase, Reason
from proxy.cancel_http import HangupCancelAdapter
from proxy.errors import ProxyError
from proxy.vocabulary import CancelResult
from tests.gateway_fixtures import Gateway
from tests.support import REPO, spawn
from tests.test_grpc_gateway import LONG, Stream, cancel_id_of, inputs

PACKAGES = ("hangup_contract", "gateway_server", "proxy")


def imported_packages(package: str) -> set[str]:
    """Top-level packages imported anywhere in ``package`` (static: every import statement)."""
    found: set[str] = set()
    for path in (REPO / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
    return found & set(PACKAGES)


def test_both_sides_import_the_contract_and_not_each_other() -> None:
    assert imported_packages("hangup_contract") == {"hangup_contract"}
    assert imported_packages("proxy") == {"proxy", "hangup_contract"}
    assert imported_packages("gateway_server") == {"gateway_server", "hangup_contract"}


@pytest.mark.parametrize("reason", list(Reason))
def test_every_reason_survives_the_cancel_body(reason: Reason) -> None:
    assert parse_request(encode_request(reason)) is reason


@pytest.mark.parametrize(
    ("body", "expected"),
    [(b"", Reason.EXPLICIT), (b"  ", Reason.EXPLICIT), (b"{}", Reason.EXPLICIT),
     (b'{"reason": null}', Reason.EXPLICIT), (b'{"reason": "shutdown"}', Reason.SHUTDOWN)],
)  # fmt: skip
def test_a_cancel_body_without_a_reason_means_explicit(body: bytes, expected: Reason) -> None:
    assert parse_request(body) is expected


@pytest.mark.parametrize(
    ("body", "message"),
    [(b"{", "not valid JSON"), (b"[]", "must be a JSON object"),
     (b'{"reason": 3}', "'reason' must be a string"),
     (b'{"reason": "bored"}', "unknown reason 'bored'; expected one of: client_disconnect")],
)  # fmt: skip
def test_a_bad_cancel_body_names_its_problem(body: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_request(body)


@pytest.mark.parametrize(
    "answer",
    [CancelAnswer("a", CancelState.CANCELLED, Phase.PREFILL, 0),
     CancelAnswer("b:7", CancelState.FINISHED, None, 12)],
)  # fmt: skip
def test_cancel_answers_survive_json(answer: CancelAnswer) -> None:
    assert CancelAnswer.from_json(str(answer.to_json()).replace("'", '"')) == answer


@pytest.mark.parametrize(
    ("text", "message"),
    [("nope", "not valid JSON"), ('{"state": "gone"}', "no known state: 'gone'"),
     ('{"state": "finished", "generated_tokens": "3"}', "must be an integer")],
)  # fmt: skip
def test_a_bad_cancel_answer_names_its_problem(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CancelAnswer.from_json(text)


def test_the_cancel_path_carries_any_id_as_one_path_segment() -> None:
    assert cancel_path("abc-1") == "/v2/requests/abc-1/cancel"
    assert cancel_path("call:a/b ?#%") == "/v2/requests/call%3Aa%2Fb%20%3F%23%25/cancel"


@pytest.mark.parametrize("good", ["a", "0" * 128, "cmpl-3f.x_y:z", "A-Z"])
def test_ids_the_rule_accepts(good: str) -> None:
    assert request_id.is_valid(good)


@pytest.mark.parametrize("bad", ["", "0" * 129, "a b", "a/b", "a?b", "é", "a\nb", "a,b"])
def test_ids_the_rule_refuses(bad: str) -> None:
    assert not request_id.is_valid(bad)


def test_fresh_ids_follow_the_rule_and_differ() -> None:
    ids = {request_id.new_request_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(request_id.is_valid(i) and len(i) == 32 for i in ids)


@pytest.fixture
async def client(gateway: Gateway) -> AsyncIterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(gateway.server.listeners["grpc"])
    try:
        yield c
    finally:
        await c.close()


async def test_the_proxy_cancels_a_stream_request_by_an_alias_of_any_characters(
    gateway: Gateway, client: triton.InferenceServerClient
) -> None:
    stream = Stream(client)
    stream.send("req/1 ?#%", "Hello", max_tokens=LONG, ignore_eos=True)
    first, error = await stream.next()
    assert error is None, error
    alias = cancel_id_of(first)
    assert alias.endswith(":req/1 ?#%")
    adapter = HangupCancelAdapter(gateway.url, gateway.token, attempt_timeout=5.0)
    try:
        assert await adapter.cancel(alias, Reason.EXPLICIT) is CancelResult.OK
        while error is None:  # responses already on their way come first
            _, error = await stream.next()
        assert "CANCELLED" in str(error)
        assert await adapter.cancel(alias, Reason.EXPLICIT) is CancelResult.FINISHED
    finally:
        stream.close()
        await adapter.close()
    assert gateway.cancellations("explicit", "decode") == 1


async def test_the_gateway_refuses_an_id_that_breaks_the_rule(gateway: Gateway) -> None:
    body = {"model": "hangup-sim", "prompt": "Hi", "max_tokens": 2}
    url = gateway.url + "/v1/completions"
    async with gateway.session.post(url, json=body, headers={"X-Request-Id": "a b"}) as resp:
        assert resp.status == 400
        assert request_id.RULE in (await resp.json())["error"]["message"]
    client = triton.InferenceServerClient(gateway.server.listeners["grpc"])
    try:
        with pytest.raises(InferenceServerException) as caught:
            await client.infer("hangup-sim", inputs("Hi", stream=False, max_tokens=2),
                               headers={"x-request-id": "a/b"})  # fmt: skip
    finally:
        await client.close()
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert request_id.RULE in (caught.value.message() or "")


def test_no_module_reads_the_removed_copies() -> None:
    """The contract's names are defined once: neither side keeps a copy of its own."""
    for package in ("gateway_server", "proxy"):
        for path in Path(REPO / package).rglob("*.py"):
            text = path.read_text()
            assert "class Reason(" not in text and "class Phase(" not in text, path


def test_gateway_transports_use_only_the_service() -> None:
    """HTTP and gRPC handlers reach engines and calls through ``GenerationService`` alone, and
    neither transport imports the other."""
    for transport, other in (("http", "grpc"), ("grpc", "http")):
        for path in (REPO / "gateway_server" / transport).glob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            reached = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
            assert not reached & {"pool", "registry", "workers"}, (path, reached & {"pool"})
            modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
            assert not any(m and m.startswith(f"gateway_server.{other}") for m in modules), path


def test_every_exception_the_proxy_defines_is_in_its_one_tree() -> None:
    for path in sorted((REPO / "proxy").glob("*.py")):
        module = importlib.import_module(f"proxy.{path.stem}")
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
            ):
                assert issubclass(obj, ProxyError), f"proxy.{path.stem}.{name}"


def test_both_processes_write_one_log_line_shape(tmp_path: Path) -> None:
    """Operators' log pipelines read the gateway and the proxy of a pod the same way."""
    with spawn("gateway_server", ["--http-port", "0", "--grpc-port", "0"], tmp_path / "g") as gw:
        args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                "--upstream-http", gw.url()]  # fmt: skip
        with spawn("proxy", args, tmp_path / "p") as px:
            assert px.terminate() == 0
        assert gw.terminate() == 0
        logs = {"gateway": gw.log(), "proxy": px.log()}
    for process, text in logs.items():
        records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        assert records, process
        for record in records:
            assert list(record)[:4] == ["ts", "level", "logger", "msg"], (process, record)
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["ts"]), record
            assert record["logger"].startswith(f"hangup.{process}"), record
        assert any(r["msg"] in {"serving", "listening"} for r in records), (process, records)
