"""Every parser a client reaches, with the hostile inputs it is held to and what it must do with
them: the properties that ``tests/hostile/`` runs a bounded number of times (derandomized) and
``python -m bench.robustness.hostile`` runs with fresh seeds (docs/security.md, "Parsers").

A hostile input is a recipe a Hypothesis strategy draws: a unit repeated to a size up to the
parser's limit (what makes work grow: tiny arrays, tiny chunks, many dimensions, many fields)
inside a frame, then a few bytes changed. Each :class:`Parser`'s ``check`` parses one input in
the calling thread, measures the CPU time it took (:func:`bench.harness.hostile.timed`), holds
it to the parser's :class:`~bench.harness.hostile.Budget`, and allows only the parser's
documented client error: it raises ``AssertionError`` naming the input otherwise.

- ``http``: the proxy's HTTP/1.1 server (``proxy.http.protocol``, ``head_rules``), one
  connection in memory, heads up to the field limits and bodies up to ``--max-body-size``
  (chunked or by length, pipelined requests), read 64 KiB at a time, each body read to its end
  by a handler that answers 200 (or 413 past the body limit): a well-formed answer of 200 or a
  client error, nothing escaping.
- ``triton-infer`` and ``triton-generate``: the Triton bridge's reading of ``/infer``'s JSON and
  binary tensors and of ``generate``'s (and ``generate_stream``'s) JSON into a KServe request
  (``proxy.triton``): a request or a 400 (``GenerateError``).
- ``grpc-metadata``: the gRPC relay's reading of a call's metadata (``proxy.grpc.metadata``, the
  call's ids) and of its peer (``proxy.grpc.peer.parse_peer``): metadata, or ``BadRequestId``
  (``INVALID_ARGUMENT``) for a trusted id that breaks the rule.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from hypothesis import Phase
from hypothesis import strategies as st

from bench.harness.hostile import MIB, Budget, timed, untraced
from bench.harness.memory_transport import MemoryTransport
from bench.harness.server_fuzz import messages, mutated
from hangup_contract.runtime.connections import ConnectionLimits
from proxy.calls.request_ids import choose_request_ids
from proxy.config import Config
from proxy.errors import BadBody, BadRequestId
from proxy.grpc.metadata import client_metadata, relayable, upstream_metadata
from proxy.grpc.peer import parse_peer
from proxy.http.protocol import SERVER_LOGGER
from proxy.http.server import HttpServer
from proxy.messages import Answer, Request, error_answer
from proxy.triton.codec import GenerateError, ModelInputs, built, generate_request, parse_body
from proxy.triton.infer import infer_request

# The phases a timed property runs in: not Hypothesis's shrink and explain, whose reruns of a
# failing example are not that example (explain traces every line it runs: 10-100 times the
# CPU, so every rerun breaks the budget), so the first failure is reported as it was found.
PHASES = (Phase.explicit, Phase.generate)
T = TypeVar("T")
_DEFAULTS = Config()
BODY_LIMIT = _DEFAULTS.max_body_size or 8 * MIB
METADATA_LIMIT = 16 * 1024  # grpc-core's hard limit on a call's metadata (HPACK's sizes)
# The bridge's: a Python object for each JSON array and number, and a body msgspec refuses read
# again by json, which takes 0.5 us for a float that underflows (security.md, "Parsers")
BRIDGE_BUDGET = Budget(per_mib=0.150)
HTTP_BUDGET = Budget(per_mib=0.040)  # one-byte chunks: a parser callback each (security.md)


@dataclass(frozen=True)
class Seen:
    """One input parsed: its size, the CPU it took, and what it began with."""

    nbytes: int
    spent: float
    what: str = ""


@dataclass(frozen=True)
class Parser:
    name: str
    parses: str  # the code it drives
    limit: int  # the largest input, in bytes
    budget: Budget
    inputs: st.SearchStrategy[Any]
    check: Callable[[Any], Seen]
    worst: Callable[[], list[Any]]  # the costliest inputs known, at the limit: run every time


# --- recipes --------------------------------------------------------------------------------


def _size(limit: int) -> st.SearchStrategy[int]:
    """A size up to ``limit``, spread over every power of two (most inputs small, some at the
    limit: the costly ones are the large ones)."""
    return st.integers(0, limit.bit_length() - 1).flatmap(
        lambda k: st.integers(1 << k >> 1, min(1 << k, limit))
    )


def _collector_paused(measure: Callable[[], T]) -> T:
    """``measure()`` :func:`~bench.harness.hostile.untraced`: no collection of the whole process
    (this one holds Hypothesis's thousands of examples) falls due while an input is parsed (the
    bridge pauses the collector itself while it reads a body; it fell due on the first allocation
    after, the refusal's traceback), and no coverage tracer counts its lines."""
    with untraced():
        return measure()


def _fill(start: bytes, unit: bytes, end: bytes, size: int) -> bytes:
    count = max(1, (size - len(start) - len(end)) // max(1, len(unit)))
    middle = unit * count
    if middle.endswith(b","):
        middle = middle[:-1]
    return start + middle + end


def _changed(data: bytes, changes: list[tuple[float, bytes]]) -> bytes:
    """``data`` with each ``(where, byte)`` of ``changes`` written at that fraction of it."""
    out = bytearray(data)
    for where, byte in changes:
        at = min(int(where * len(out)), max(len(out) - 1, 0))
        out[at : at + 1] = byte
    return bytes(out)


_CHANGES = st.lists(
    st.tuples(st.floats(0, 1), st.sampled_from([b"[", b"]", b"{", b"}", b",", b'"', b"\\",
                                                b"\x00", b"\xff", b"9", b"-", b"\r", b"\n"])),
    max_size=3,
)  # fmt: skip


def _recipes(
    frames: st.SearchStrategy[tuple[bytes, bytes]], units: list[bytes], limit: int
) -> st.SearchStrategy[bytes]:
    filled = st.builds(
        lambda frame, unit, size: _fill(frame[0], unit, frame[1], size),
        frames,
        st.sampled_from(units),
        _size(limit),
    )
    return st.builds(_changed, filled, _CHANGES)


# --- the Triton bridge ------------------------------------------------------------------------

INFER_MODEL = ModelInputs(
    "m", "", {"INPUT0": "FP32", "TEXT": "BYTES", "FLAG": "BOOL", "COUNT": "INT64",
              "SMALL": "UINT8", "HALF": "FP16"}, False, frozenset({"OUTPUT0"}),
)  # fmt: skip
_DATATYPES = [b"FP32", b"FP64", b"INT32", b"UINT8", b"INT64", b"BOOL", b"BYTES", b"FP16", b"X"]
_SHAPES = [b"[1]", b"[0]", b"[-1]", b"[2,2]", b'["a"]', b"[1e999]", b"[9223372036854775808]"]
_VALUES = [b"1,", b"1.25,", b"-0,", b"1e308,", b"1e-400,", b"1e23,", b"8.98846567431158e307,",
           b"NaN,", b"true,", b'"a",', b"null,", b"[1],", b"[],", b"[[1]],", b"{},",
           b"[1,[2]],", b'"\\ud800",', b'"\xc3\xa9",', b"9" * 400 + b",",
           b"4294967296,"]  # fmt: skip
_DIMENSIONS = [b"2,", b"0,", b"1,", b"9999999999,", b"-1,", b'"a",', b"1.5,", b"null,", b"[],"]
_ENTRIES = [b'{"name":"INPUT0","datatype":"FP32","shape":[1],"data":[1]},', b"{},", b"1,",
            b'{"name":"OUTPUT0"},', b'{"name":"X"},', b'{"name":"\\udfff"},']  # fmt: skip
_PARAMETERS = [b'"a":1,', b'"b":9223372036854775808,', b'"c":"\\ud800",', b'"d":{},',
               b'"e":1' + b"0" * 400 + b",", b'"f":[1,2],']  # fmt: skip


def _tensor_frames() -> st.SearchStrategy[tuple[bytes, bytes]]:
    return st.builds(
        lambda name, datatype, shape: (
            b'{"inputs":[{"name":"' + name + b'","datatype":"' + datatype + b'","shape":'
            + shape + b',"data":[',
            b"]}]}",
        ),
        st.sampled_from([b"INPUT0", b"TEXT", b"FLAG", b"COUNT", b"SMALL", b"HALF"]),
        st.sampled_from(_DATATYPES),
        st.sampled_from(_SHAPES),
    )  # fmt: skip


def _nested(depth: int, leaf: bytes) -> bytes:
    return (b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],"data":'
            + b"[" * depth + leaf + b"]" * depth + b"}]}")  # fmt: skip


def _binary(sizes: list[int], tail: int, header: str | None) -> tuple[bytes, str | None]:
    inputs = [{"name": "INPUT0", "datatype": "FP32", "shape": [2],
               "parameters": {"binary_data_size": size}} for size in sizes]  # fmt: skip
    head = json.dumps({"inputs": inputs}).encode()
    length = str(len(head)) if header is None else header
    return head + b"\0" * tail, length


def _infer_inputs(limit: int) -> st.SearchStrategy[tuple[bytes, str | None]]:
    json_bodies = st.one_of(
        _recipes(_tensor_frames(), _VALUES, limit),
        _recipes(
            st.just(
                (b'{"inputs":[{"name":"INPUT0","datatype":"FP32","data":[1],"shape":[', b"]}]}")
            ),
            _DIMENSIONS,
            limit,
        ),
        _recipes(
            st.sampled_from([(b'{"inputs":[', b"]}"), (b'{"inputs":[],"outputs":[', b"]}")]),
            _ENTRIES,
            limit,
        ),
        _recipes(st.just((b'{"inputs":[],"parameters":{', b"}}")), _PARAMETERS, limit),
        st.builds(_nested, st.integers(0, 5000), st.sampled_from([b"1", b"", b"[]"])),
    ).map(lambda body: (body, None))
    binary = st.builds(
        _binary,
        st.lists(st.sampled_from([0, 4, 8, 2**63]), min_size=1, max_size=3),
        _size(limit),
        st.sampled_from([None, "0", "-1", "abc", "9" * 30, str(2**20)]),
    )  # fmt: skip
    return st.one_of(json_bodies, binary)


def _bridge_check(name: str, read: Callable[[bytes, str | None], object]) -> Callable[..., Seen]:
    def check(case: tuple[bytes, str | None]) -> Seen:
        raw, header = case
        outcome = _collector_paused(lambda: timed(built, lambda: read(raw, header)))
        error = outcome.error
        if error is not None and not (isinstance(error, GenerateError) and error.status == 400):
            raise AssertionError(f"{name}: {type(error).__name__}: {error} for {raw[:120]!r}")
        BRIDGE_BUDGET.check(f"{name} {raw[:60]!r}", len(raw), outcome.spent)
        return Seen(len(raw), outcome.spent, repr(raw[:80]))

    return check


GENERATE_MODEL = ModelInputs("m", "", dict(INFER_MODEL.datatypes), False)


def _generate_inputs(limit: int) -> st.SearchStrategy[tuple[bytes, str | None]]:
    frames = st.sampled_from(
        [
            (b'{"' + key + b'":[', b"]}")
            for key in [b"INPUT0", b"TEXT", b"FLAG", b"COUNT", b"SMALL", b"HALF", b"zz"]
        ]
    )
    bodies = st.one_of(
        _recipes(frames, _VALUES, limit),
        _recipes(st.just((b'{"parameters":{', b"}}")), _PARAMETERS, limit),
        _recipes(st.just((b"{", b"}")), [b'"k":1,', b'"INPUT0":1,', b'"\\ud800":1,'], limit),
        st.builds(lambda depth: b'{"INPUT0":' + b"[" * depth + b"]" * depth + b"}",
                  st.integers(0, 5000)),
    )  # fmt: skip
    return bodies.map(lambda body: (body, None))


def _infer_worst() -> list[tuple[bytes, str | None]]:
    tensor = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],"data":['
    text = b'{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1],"data":['
    bodies = [
        _fill(tensor, b"[1],", b"]}]}", BODY_LIMIT),  # a Python list for each value
        _fill(tensor, b"[],", b"]}]}", BODY_LIMIT),
        _fill(tensor, b"1,[1],", b"]}]}", BODY_LIMIT),  # ragged: walked, not joined
        _fill(tensor, b"1.25,", b"]}]}", BODY_LIMIT),
        _fill(tensor, b"1e308,", b"]}]}", BODY_LIMIT),  # msgspec's slow floats: 10 s, was
        _fill(tensor, b"8.98846567431158e307,", b"]}]}", BODY_LIMIT),
        _fill(tensor, b"1e23,", b"]}]}", BODY_LIMIT),
        _fill(tensor, b"1e-400,", b'],"x":NaN}]}', BODY_LIMIT),  # msgspec, then json: 90 ms/MiB
        _fill(text, b'"",', b"]}]}", BODY_LIMIT),
        _fill(b'{"inputs":[{"name":"INPUT0","datatype":"FP32","data":[1],"shape":[', b"2,",
              b"]}]}", BODY_LIMIT),  # finding 3: 4 million dimensions
        _fill(b'{"x":NaN,"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],"data":[',
              b"1.5,", b"]}]}", BODY_LIMIT),  # read by json, not msgspec
        _fill(b'{"inputs":[],"outputs":[', b'{"name":"OUTPUT0"},', b"]}", BODY_LIMIT),
        _nested(5000, b"1"),
    ]  # fmt: skip
    return [(body, None) for body in bodies] + [_binary([8], BODY_LIMIT, None)]


def _generate_worst() -> list[tuple[bytes, str | None]]:
    bodies = [
        _fill(b'{"INPUT0":[', b"1,", b"]}", BODY_LIMIT),
        _fill(b'{"INPUT0":[', b"1e290,", b"]}", BODY_LIMIT),
        _fill(b'{"TEXT":[', b'"",', b"]}", BODY_LIMIT),
        _fill(b'{"FLAG":[', b"true,", b"]}", BODY_LIMIT),
        _fill(b'{"zz":[', b"[],", b"]}", BODY_LIMIT),  # ignored, but read
        _fill(b'{"parameters":{', b'"a":1,', b"}}", BODY_LIMIT),
    ]
    return [(body, None) for body in bodies]


# --- the HTTP/1.1 server ----------------------------------------------------------------------

_CHUNKS = [b"1\r\na\r\n", b"1;a=b\r\na\r\n", b"0001\r\na\r\n", b"1;" + b"e" * 200 + b"\r\na\r\n",
           b"10\r\n" + b"a" * 16 + b"\r\n", b"1\r\n\r\n", b"zz\r\na\r\n"]  # fmt: skip
_FIELDS = [
    b"X-A: v\r\n",
    b"X-B: " + b"v" * 1000 + b"\r\n",
    b"Host: a\r\n",
    b" folded\r\n",
    b"Content-Length: 1\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"X-N: \x00\r\n",
    b"X-Request-Id: " + b"i" * 8000 + b"\r\n",
    b"Cookie: " + b"c=1; " * 100 + b"\r\n",
]
_PIPELINED = [b"GET /c HTTP/1.1\r\nHost: a\r\n\r\n", b"POST /c HTTP/1.1\r\nHost: a\r\n"
              b"Content-Length: 1\r\n\r\na"]  # fmt: skip
_ANSWERS = {200, 400, 408, 413, 414, 417, 431, 501, 505}


def _http_inputs(limit: int) -> st.SearchStrategy[bytes]:
    head_limit = _DEFAULTS.max_header_size * (_DEFAULTS.max_headers + 2)
    chunked = (b"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", b"0\r\n\r\n")
    sized = st.builds(
        lambda size: (
            b"POST /c HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % size + b"a" * size
        ),
        _size(limit),
    )
    return st.one_of(
        _recipes(st.just(chunked), _CHUNKS, limit),
        _recipes(st.just((b"GET /c HTTP/1.1\r\nHost: a\r\n", b"\r\n")), _FIELDS, head_limit),
        _recipes(st.just((b"GET /", b" HTTP/1.1\r\nHost: a\r\n\r\n")), [b"a", b"%ff", b"/.."],
                 2 * _DEFAULTS.max_header_size),
        _recipes(st.just((b"", b"")), _PIPELINED, head_limit),
        st.builds(_changed, sized, _CHANGES),
        messages.map(b"".join).flatmap(mutated),  # the framing fuzz's requests, mutated
    )  # fmt: skip


def _http_worst() -> list[bytes]:
    chunked = b"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    field = b"X-A: " + b"v" * (_DEFAULTS.max_header_size - 10) + b"\r\n"
    return [
        _fill(chunked, b"1\r\na\r\n", b"0\r\n\r\n", BODY_LIMIT),  # a callback a byte
        _fill(chunked, b"1;a=b\r\na\r\n", b"0\r\n\r\n", BODY_LIMIT),
        b"GET /c HTTP/1.1\r\nHost: a\r\n" + field * (_DEFAULTS.max_headers - 1) + b"\r\n",
        _fill(b"", _PIPELINED[0], b"", BODY_LIMIT),
    ]


async def _serve(data: bytes, body_limit: int) -> tuple[bytes, list[str], float]:
    """``data`` through one connection of a fresh server: what it wrote, what escaped to the
    event loop, and the CPU time the connection took (parsing, and the handler's reads)."""
    logging.getLogger(SERVER_LOGGER).setLevel(logging.ERROR)  # a warning per refused request
    escaped: list[str] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: escaped.append(str(context)))

    async def handler(request: Request) -> Answer:
        size = 0
        try:
            while chunk := await request.content.readany():
                size += len(chunk)
                if size > body_limit:
                    return error_answer(413, "request body exceeds the limit")
        except BadBody:  # a broken chunked body: the relay's answer
            return error_answer(400, "the request body is broken")
        return Answer(200, b"ok")

    limits = ConnectionLimits(header_timeout=30, idle_timeout=75, max_connections=0,
                              body_timeout=60)  # fmt: skip
    server = HttpServer(
        handler, on_lost=lambda _: None, error=error_answer, limits=limits,
        on_close=lambda reason: None, listener="http",
        max_header_size=_DEFAULTS.max_header_size, max_headers=_DEFAULTS.max_headers,
    )  # fmt: skip
    connection = server()
    transport = MemoryTransport()
    connection.connection_made(transport)
    started = time.thread_time()  # the parse and the handler's reads, not the loop's making
    for at in range(0, len(data), 65536):
        if transport.closing or transport.paused:
            break
        connection.data_received(data[at : at + 65536])
        for _ in range(3):  # the handler reads what arrived, as it would between two reads
            await asyncio.sleep(0)
    for _ in range(10):
        await asyncio.sleep(0)
    spent = time.thread_time() - started
    connection.connection_lost(None)
    await server.shutdown(0)
    return bytes(transport.written), escaped, spent


def _statuses(written: bytes) -> list[int]:
    return [int(line[9:12]) for line in written.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]


def _http_check(data: bytes) -> Seen:
    loop = asyncio.new_event_loop()
    try:
        written, escaped, spent = _collector_paused(
            lambda: loop.run_until_complete(_serve(data, BODY_LIMIT))
        )
    finally:
        loop.close()
    statuses = _statuses(written)
    if escaped or not set(statuses) <= _ANSWERS:
        raise AssertionError(f"http: {statuses} {escaped} for {data[:120]!r}")
    HTTP_BUDGET.check(f"http {data[:60]!r}", len(data), spent)
    return Seen(len(data), spent, repr(data[:80]))


# --- gRPC metadata ----------------------------------------------------------------------------

_PAIRS: list[tuple[str, str | bytes]] = [
    ("x-a", "v"), ("x-request-id", "id-1"), ("x-request-id", "x" * 2000), ("x-request-id", ""),
    ("x-request-id", "é\u2028"), ("grpc-timeout", "1S"), (":path", "/x"), ("user-agent", "u"),
    ("a-bin", b"\x00\xff" * 50), ("x-client-request-id", "c"), ("authorization", "Bearer t"),
    ("te", "trailers"), ("x-b", "v" * 4000),
]  # fmt: skip
_PEERS = [
    "ipv4:127.0.0.1:5",
    "ipv6:[::1]:5",
    "ipv6:[::ffff:1.2.3.4]:65535",
    "unix:/x",
    "ipv4:" + "1" * 5000,
    "ipv6:[" + ":" * 3000 + "]:1",
    "ipv4:1.2.3.4:" + "9" * 5000,
]


def _entry_size(pair: tuple[str, Any]) -> int:
    """An entry's size as grpc-core counts it against its limit (HPACK's: 32 bytes more than its
    name and value)."""
    return len(pair[0]) + len(pair[1]) + 32


def _metadata_inputs(limit: int) -> st.SearchStrategy[tuple[list[tuple[str, Any]], str]]:
    def filled(pair: tuple[str, Any], size: int, mixed: list[tuple[str, Any]]) -> list[Any]:
        return [pair] * max(1, size // _entry_size(pair)) + mixed

    pairs = st.builds(filled, st.sampled_from(_PAIRS), _size(limit),
                      st.lists(st.sampled_from(_PAIRS), max_size=5))  # fmt: skip
    return st.tuples(pairs, st.sampled_from(_PEERS))


def _read_metadata(metadata: list[tuple[str, Any]], peer: str, trust: bool) -> None:
    strings = [(k, v) for k, v in metadata if isinstance(v, str)]
    try:
        ids = choose_request_ids(strings, trust_client=trust)
    except BadRequestId:
        return  # INVALID_ARGUMENT, as the relay answers it
    upstream_metadata(metadata, ids)
    client_metadata(relayable(metadata), ids.upstream)
    parse_peer(peer)


def _metadata_worst() -> list[tuple[list[tuple[str, Any]], str]]:
    return [
        ([("a", "")] * (METADATA_LIMIT // 33), "ipv4:127.0.0.1:1"),  # the most entries
        ([("x-request-id", "i" * (METADATA_LIMIT - 44))], "ipv6:[::1]:1"),
    ]


def _metadata_check(case: tuple[list[tuple[str, Any]], str]) -> Seen:
    metadata, peer = case
    nbytes = sum(map(_entry_size, metadata)) + len(peer)
    spent = 0.0
    for trust in (False, True):
        outcome = _collector_paused(partial(timed, _read_metadata, metadata, peer, trust))
        if outcome.error is not None:
            raise AssertionError(f"grpc-metadata: {outcome.error!r} for {metadata[:3]}, {peer!r}")
        spent = max(spent, outcome.spent)
    Budget().check(f"grpc-metadata {metadata[:2]}", nbytes, spent)
    return Seen(nbytes, spent, f"{len(metadata)} entries, {metadata[:2]}")


PARSERS: dict[str, Parser] = {
    parser.name: parser
    for parser in (
        Parser("http", "proxy.http.protocol, head_rules (httptools)", BODY_LIMIT, HTTP_BUDGET,
               _http_inputs(BODY_LIMIT), _http_check, _http_worst),
        Parser("triton-infer", "proxy.triton.infer, tensors, codec.parse_body", BODY_LIMIT,
               BRIDGE_BUDGET, _infer_inputs(BODY_LIMIT),
               _bridge_check("triton-infer", lambda raw, header: infer_request(
                   INFER_MODEL, raw, header)), _infer_worst),
        Parser("triton-generate", "proxy.triton.codec (generate, generate_stream)", BODY_LIMIT,
               BRIDGE_BUDGET, _generate_inputs(BODY_LIMIT),
               _bridge_check("triton-generate", lambda raw, _: generate_request(
                   GENERATE_MODEL, parse_body(raw))), _generate_worst),
        Parser("grpc-metadata", "proxy.grpc.metadata, calls.request_ids, grpc.peer",
               METADATA_LIMIT, Budget(), _metadata_inputs(METADATA_LIMIT), _metadata_check,
               _metadata_worst),
    )
}  # fmt: skip
