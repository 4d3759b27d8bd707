"""The contract between the proxy and the gateway (``hangup_contract``): one definition, used by
both, encoded and parsed the same way on both sides.

Pure checks of the codecs, the id rule and the package structure. The two sides talking over
real sockets are in ``in_process/test_contract_on_the_wire.py``; the one log line shape of both
processes in ``multi_process/test_pod_logs.py``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bench.base.processes import REPO
from hangup_contract import request_id
from hangup_contract.cancel import (
    CancelAnswer,
    answer_state,
    bearer_matches,
    cancel_path,
    encode_request,
    parse_request,
)
from hangup_contract.cancel_labels import CancelState, Phase, Reason
from proxy.errors import ProxyError

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
     (b'{"reason": "bored"}', "unknown reason 'bored'; expected one of: client_disconnect"),
     (b"[" * 65536, "not valid JSON"), (b'{"reason": ' + b"9" * 5000 + b"}", "not valid JSON")],
)  # fmt: skip
def test_a_bad_cancel_body_names_its_problem(body: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_request(body)


@pytest.mark.parametrize(
    "authorization",
    ["Bearer \udcff\udcfe", "Bearer t\ud800ken", "\udcffearer token", "Bearer token\udc80"],
)
def test_an_authorization_that_is_not_utf8_never_matches_and_never_raises(
    authorization: str,
) -> None:
    """Servers hand a field's bytes that are not UTF-8 over as lone surrogates (aiohttp, the
    proxy's own server): the check is shared by the proxy's and the gateway's cancel API."""
    assert bearer_matches(authorization, "token") is False
    assert bearer_matches("Bearer token", "token") and bearer_matches("bearer  token ", "token")


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


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ('{"state": "cancelled", "phase": "transfer", "kv_blocks": 7}', CancelState.CANCELLED),
        ('{"state": "finished", "generated_tokens": "many", "new": {}}', CancelState.FINISHED),
        (
            '{"state": "cancelled", "phase": "transfer", "legs": [{"role": "prefill"}]}',
            CancelState.CANCELLED,
        ),
    ],
)
def test_the_state_is_read_past_phases_and_fields_this_side_does_not_know(
    text: str, state: CancelState
) -> None:
    """An older proxy beside a newer gateway still counts a cancel by its state (DESIGN: sides
    of the contract accept phases and answer fields they do not know)."""
    assert answer_state(text) is state


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", "must be a JSON object"),
        ('{"state": "gone"}', "no known state: 'gone'"),
        ('{"state": "cancelled", "phase": 3}', "phase is not a string"),
    ],
)
def test_an_answer_without_a_known_state_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        answer_state(text)


def test_the_cancel_path_carries_any_id_as_one_path_segment() -> None:
    assert cancel_path("abc-1") == "/v2/requests/abc-1/cancel"
    assert cancel_path("call:a/b ?#%") == "/v2/requests/call%3Aa%2Fb%20%3F%23%25/cancel"


@pytest.mark.parametrize("good", ["a", "0" * 128, "cmpl-3f.x_y:z", "A-Z"])
def test_ids_the_rule_accepts(good: str) -> None:
    assert request_id.is_valid(good)


@pytest.mark.parametrize("bad", ["", "0" * 129, "a b", "a/b", "a?b", "é", "a\nb", "a,b"])
def test_ids_the_rule_refuses(bad: str) -> None:
    assert not request_id.is_valid(bad)


@pytest.mark.parametrize(
    "good", ["a", "0" * 128, "call-1:7", "call-1:a/b ?#%é", "c:" + "x" * 255, "a:b:c"]
)
def test_cancel_ids_the_rule_accepts(good: str) -> None:
    """An id, or a stream request's alias: a call id, a colon, the client's own id (any
    characters), 257 characters at most in all."""
    assert request_id.is_cancel_id(good)


@pytest.mark.parametrize(
    "bad", ["", "0" * 129, "a b", "c:" + "x" * 256, "é:1", "a b:c", "/x:y", "c:x\n" * 100]
)
def test_cancel_ids_the_rule_refuses(bad: str) -> None:
    assert not request_id.is_cancel_id(bad)


def test_a_cancel_id_of_20_mib_is_refused_without_reading_it_all() -> None:
    huge = "c:" + "9" * (20 << 20)
    started = time.thread_time()
    assert not request_id.is_cancel_id(huge)
    assert time.thread_time() - started < 0.005


def test_fresh_ids_follow_the_rule_and_differ() -> None:
    ids = {request_id.new_request_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(request_id.is_valid(i) and len(i) == 32 for i in ids)


def test_fresh_ids_differ_across_threads_and_forks() -> None:
    """Ids come from a pool of random bytes read ahead: threads draw from pools of their own,
    and a forked child does not hand out the ids its parent would have handed out next."""
    with ThreadPoolExecutor(4) as pool:
        batches = list(
            pool.map(lambda _: [request_id.new_request_id() for _ in range(500)], range(8))
        )
    drawn = [i for batch in batches for i in batch]
    assert len(set(drawn)) == len(drawn)
    request_id.new_request_id()  # the pool holds ids ahead now
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: its next ids, to the parent
        os.write(write, "".join(request_id.new_request_id() for _ in range(8)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read) as pipe:
        theirs = pipe.read()
    ours = "".join(request_id.new_request_id() for _ in range(8))
    assert len(theirs) == len(ours) == 256 and theirs != ours


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
