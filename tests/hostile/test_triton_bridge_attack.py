"""The Triton bridge under attack, live: an in-process proxy (``--cancel-adapter triton``) in
front of a stand-in for Triton's gRPC service (``tests/support/triton_stand_in.py``) receives
the costliest bodies known, several at once, up to ``--max-body-size``, while its event loop is
watched (``ArmedLoop``) and its health endpoint asked every 50 ms. Finding 3 of issue 59: a
625 KiB body whose shape is many 2s held the loop 5-9 s (a health check waited 9 s). Now no
stall passes a second, each health check is answered within one, and each body gets Triton's
answer or its 400."""

from __future__ import annotations

import asyncio
import io
import json
import time

import aiohttp

from bench.harness.hostile import ArmedLoop
from bench.harness.hostile_parsers import BODY_LIMIT, _fill
from proxy.config import AdapterName
from tests.support.proxy_harness import http_url, running_proxy
from tests.support.triton_stand_in import running_stand_in

STALL_LIMIT_S = 1.0
TENSOR = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],"data":['
ATTACK = [  # (route, body)
    ("infer", json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "data": [1, 2],
                                      "shape": [2] * (625 * 512)}]}).encode()),  # finding 3
    ("infer", _fill(b'{"inputs":[{"name":"INPUT0","datatype":"FP32","data":[1],"shape":[',
                    b"2,", b"]}]}", BODY_LIMIT)),
    ("infer", _fill(TENSOR, b"[1],", b"]}]}", BODY_LIMIT)),
    ("infer", _fill(TENSOR, b"1,[1],", b"]}]}", BODY_LIMIT)),
    ("infer", _fill(b'{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1],"data":[',
                    b'"",', b"]}]}", BODY_LIMIT)),
    ("infer", _fill(b'{"inputs":[],"outputs":[', b'{"name":"OUTPUT0"},', b"]}", BODY_LIMIT)),
    ("generate", _fill(b'{"INPUT0":[', b"1,", b"]}", BODY_LIMIT)),
    ("generate", _fill(b'{"zz":[', b"[],", b"]}", BODY_LIMIT)),
    ("generate", _fill(b'{"INPUT0":[', b"1e290,", b"]}", BODY_LIMIT)),  # msgspec's slow floats
]  # fmt: skip


async def test_the_costliest_bodies_never_hold_the_event_loop() -> None:
    async with (
        running_stand_in() as triton,
        running_proxy(
            "http://127.0.0.1:9", upstream_grpc=triton.address, cancel_adapter=AdapterName.TRITON
        ) as proxy,
        aiohttp.ClientSession() as session,
    ):
        base, health = http_url(proxy), f"http://{proxy.addresses['admin']}/healthz"
        attacked = asyncio.Event()
        waits: list[float] = []

        async def ask_health() -> None:
            while not attacked.is_set():
                asked = time.monotonic()
                async with session.get(health) as answer:
                    assert answer.status == 200
                waits.append(time.monotonic() - asked)
                await asyncio.sleep(0.05)

        async def send(route: str, body: bytes) -> int:
            url = f"{base}/v2/models/echo/{route}"
            async with session.post(url, data=io.BytesIO(body)) as answer:  # sent as it goes
                await answer.read()
                return answer.status

        async with ArmedLoop(stall_limit=STALL_LIMIT_S) as armed:
            asking = asyncio.create_task(ask_health())
            try:
                statuses = await asyncio.gather(*(send(route, body) for route, body in ATTACK))
            finally:
                attacked.set()
                await asking
        armed.check()
        assert max(waits) < STALL_LIMIT_S, f"a health check waited {max(waits):.2f} s"
        assert set(statuses) <= {200, 400}, statuses
        assert statuses[0] == statuses[1] == 400
