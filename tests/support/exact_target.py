"""A request whose target goes out exactly as written: no client library normalizes it (``..``,
``%2e``, a doubled slash stay as they are), which is what a test of routes refused by how they
are spelled needs."""

from __future__ import annotations

import http.client
import json


def send(
    base: str, method: str, target: str, body: object = None, timeout: float = 60.0
) -> tuple[int, bytes]:
    """``method`` ``target`` to ``base`` (``http://host:port``), ``body`` as JSON where given: the
    answer's status and body."""
    connection = http.client.HTTPConnection(base.removeprefix("http://"), timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        connection.request(method, target, body=data, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()
