"""A bounded, seeded mutation fuzzer of HTTP/1.1 requests for the live processes.

``cases(seed, n)`` starts from well-formed requests hangup serves (completions, chat, KServe
generate, the cancel API, models, metrics) and mutates each: the method, the path (bytes, percent
sequences, length), header names and values (bad tokens, control bytes, duplicates, huge ones),
the body framing (conflicting or wrong ``Content-Length``, broken chunked encoding), the body
(truncated, over-long, not JSON, JSON of the wrong shape) and pipelining (two requests in one
write). ``send(address, case)`` writes one case and reads what comes back.

What a server may answer: a well-formed status line below 500, or a clean close. A 5xx,
a malformed status line or a hang past the deadline is a finding.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from bench.base.addresses import host_port

SEEDS = [
    ("POST", "/v1/completions", {"model": "hangup-sim", "prompt": "Once", "max_tokens": 4}),
    ("POST", "/v1/chat/completions",
     {"model": "hangup-sim", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
    ("POST", "/v1/completions",
     {"model": "hangup-sim", "prompt": "Once", "max_tokens": 4, "stream": True}),
    ("POST", "/v2/models/hangup-sim/generate", {"text_input": "Once", "max_tokens": 4}),
    ("POST", "/v2/models/hangup-sim/generate_stream", {"text_input": "Once", "max_tokens": 4}),
    ("POST", "/v2/requests/some-id/cancel", {"reason": "explicit"}),
    ("GET", "/v1/models", None),
    ("GET", "/v2/health/ready", None),
]  # fmt: skip
JUNK = [b"", b"\x00", b"\xff\xfe", b"\r", b"\n", b" ", b"%", b"%zz", b"..", b"\x7f", b":", b"\t"]


C = TypeVar("C")
A = TypeVar("A")


async def run_all(
    send_one: Callable[[C], Awaitable[A]], fuzz: Sequence[C], concurrency: int = 32
) -> list[tuple[C, A]]:
    """Every case through ``send_one``, ``concurrency`` at a time; each with its answer."""
    gate = asyncio.Semaphore(concurrency)

    async def one(case: C) -> tuple[C, A]:
        async with gate:
            return case, await send_one(case)

    return await asyncio.gather(*(one(c) for c in fuzz))


@dataclass
class Case:
    data: bytes
    truncated: bool  # the body is shorter than declared: the server may wait, then be left
    mutation: str


@dataclass
class Answer:
    status: int | None  # None: the server closed without a response (or before the deadline)
    head: bytes


def _body(rng: random.Random, body: object) -> tuple[bytes, str]:
    payload = json.dumps(body).encode() if body is not None else b""
    kind = rng.choice(["keep", "keep", "garbage", "wrong-shape", "huge-field", "cut"])
    if kind == "garbage":
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64))), kind
    if kind == "wrong-shape":
        return json.dumps(
            rng.choice([[], 1, "x", None, {"model": []}, {"prompt": {}}])
        ).encode(), kind
    if kind == "huge-field" and isinstance(body, dict):
        return json.dumps({**body, "prompt": "x" * rng.randint(10_000, 200_000)}).encode(), kind
    if kind == "cut" and payload:
        return payload[: rng.randint(0, len(payload) - 1)], kind
    return payload, "keep"


def _mutate_path(rng: random.Random, path: str) -> bytes:
    raw = path.encode()
    choice = rng.randint(0, 5)
    if choice == 0:
        return raw + rng.choice(JUNK)
    if choice == 1:
        return b"/" + b"a" * rng.randint(100, 9000)
    if choice == 2:
        return raw.replace(b"/", rng.choice([b"//", b"/../", b"/%2f", b"/%00"]), 1)
    if choice == 3:
        return rng.choice([b"*", b"http://evil/x", b"", b"?q=1"])
    return raw


def _case(rng: random.Random) -> Case:
    method, path, body = rng.choice(SEEDS)
    payload, body_kind = _body(rng, body)
    headers = [(b"Host", b"model"), (b"Content-Type", b"application/json")]
    method_b = method.encode()
    if rng.random() < 0.15:
        method_b = rng.choice([b"GETT", b"", b"P\x00ST", b"DELETE", b"PATCH", b"CONNECT", b"get"])
    target = _mutate_path(rng, path) if rng.random() < 0.3 else path.encode()
    framing = rng.choice(["length", "length", "chunked", "both", "twice", "wrong", "none"])
    truncated = False
    if framing == "length":
        headers.append((b"Content-Length", str(len(payload)).encode()))
        data = payload
    elif framing == "chunked":
        headers.append((b"Transfer-Encoding", b"chunked"))
        size = (
            rng.choice([len(payload), len(payload) + 5, 0]) if rng.random() < 0.3 else len(payload)
        )
        data = (
            f"{size:x}".encode()
            + b"\r\n"
            + payload
            + b"\r\n"
            + rng.choice([b"0\r\n\r\n", b"", b"zz\r\n"])
        )
        truncated = size > len(payload) or not data.endswith(b"0\r\n\r\n")
    elif framing == "both":
        headers += [
            (b"Content-Length", str(len(payload)).encode()),
            (b"Transfer-Encoding", b"chunked"),
        ]
        data = payload
    elif framing == "twice":
        headers += [
            (b"Content-Length", str(len(payload)).encode()),
            (b"Content-Length", str(len(payload) + 1).encode()),
        ]
        data = payload
    elif framing == "wrong":
        declared = len(payload) + rng.randint(1, 100)
        headers.append(
            (b"Content-Length", rng.choice([str(declared).encode(), b"-1", b"abc", b"1e3"]))
        )
        data = payload
        truncated = True
    else:
        data = payload
    if rng.random() < 0.2:
        headers.append(
            (
                rng.choice([b"X\x01Bad", b"", b"X Space", b"X-Long"]),
                rng.choice([b"v\x00", b"\xff", b"y" * rng.randint(1, 20_000), b" "]),
            )
        )
    if rng.random() < 0.1:
        headers.append((b"X-Request-Id", rng.choice([b"a b", b"../x", b"x" * 200, b"ok-id"])))
    head = method_b + b" " + target + b" HTTP/1.1\r\n"
    head += b"".join(n + b": " + v + b"\r\n" for n, v in headers) + b"\r\n"
    raw = head + data
    if rng.random() < 0.1:  # pipelining: a second, well-formed request in the same write
        raw += b"GET /v1/models HTTP/1.1\r\nHost: model\r\n\r\n"
    mutation = f"{method} {path} framing={framing} body={body_kind}"
    return Case(raw, truncated or (body_kind == "cut" and framing == "length"), mutation)


def cases(seed: int, n: int) -> list[Case]:
    rng = random.Random(seed)
    return [_case(rng) for _ in range(n)]


async def send(address: str, case: Case, deadline: float = 2.0) -> Answer:
    """Write ``case``, read the first answer's head; close. A truncated case may get no answer
    before ``deadline`` (the server is waiting for the rest): that is not a finding."""
    host, port = host_port(address)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(case.data)
        try:
            async with asyncio.timeout(deadline):
                head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return Answer(None, b"")
        except TimeoutError:
            if case.truncated:
                return Answer(None, b"")
            raise
        status_line = head.split(b"\r\n", 1)[0]
        parts = status_line.split(b" ", 2)
        # aiohttp answers a request line it cannot read in the version it guessed (0.9 too).
        assert re.fullmatch(rb"HTTP/\d\.\d", parts[0]) and parts[1].isdigit(), status_line
        return Answer(int(parts[1]), head)
    finally:
        writer.close()
