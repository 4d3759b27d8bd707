"""One log line shape in the pod: the gateway and the proxy, run as processes, write the same
JSON record fields in the same order."""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from pathlib import Path

from bench.base.addresses import host_port
from bench.base.processes import spawn
from bench.base.waiting import poll_until
from bench.harness.log_records import records, stray_lines


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
        lines = records(text)  # every line: a record
        assert lines, process
        for record in lines:
            assert list(record)[:4] == ["ts", "level", "logger", "msg"], (process, record)
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["ts"]), record
            assert record["logger"].startswith(f"hangup.{process}"), record
        assert any(r["msg"] in {"serving", "listening"} for r in lines), (process, lines)


def test_a_request_the_gateway_cannot_parse_is_one_warning_line(tmp_path: Path) -> None:
    """A request aiohttp cannot parse is the client's fault: answered 400 in the JSON error
    shape of every other answer (aiohttp writes plain text) naming what was wrong, and logged as
    one warning naming it, a JSON record like every other line (aiohttp logged it as an error
    with a traceback, through Python's last-resort handler: lines of plain text between the
    records)."""
    with spawn("gateway_server", ["--http-port", "0", "--grpc-port", "0"], tmp_path / "g") as gw:
        host, port = host_port(gw.listeners["http"])
        with socket.create_connection((host, port), timeout=10) as conn:
            conn.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Bad: v\x00\r\n\r\n")
            answer = b""
            while chunk := conn.recv(65536):  # the connection closes after the answer
                answer += chunk
        assert gw.terminate() == 0
        lines = records(gw.log())  # every line: a record
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), head
    assert b"content-type: application/json" in head.lower(), head
    error = json.loads(body)["error"]
    assert error["code"] == 400 and error["type"] == "invalid_request_error", error
    assert "header" in error["message"].lower(), error
    bad = [r for r in lines if r["msg"].startswith("bad request from 127.0.0.1")]
    assert len(bad) == 1 and bad[0]["level"] == "warning", lines
    assert "header" in bad[0]["msg"].lower() and "exc" not in bad[0], bad
    assert not [r for r in lines if r["level"] in ("error", "critical")], lines


def test_clients_that_leave_before_their_answer_are_no_error(tmp_path: Path) -> None:
    """Streaming requests whose client closes the connection right after sending them: the
    gateway finds the connection closing when it writes the answer's head. That is a hang-up,
    not a server error: no error record (aiohttp logged each with a traceback), the engine
    holds nothing afterwards, and the gateway goes on serving."""
    body = json.dumps({"model": "hangup-sim", "prompt": "x", "max_tokens": 50, "stream": True})
    request = (
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    ).encode()
    with spawn("gateway_server", ["--http-port", "0", "--grpc-port", "0"], tmp_path / "g") as gw:
        host, port = host_port(gw.listeners["http"])
        for _ in range(10):
            with socket.create_connection((host, port), timeout=10) as conn:
                conn.sendall(request)
        poll_until(lambda: not _in_flight(gw.url()), 10.0, "nothing in flight")
        with urllib.request.urlopen(gw.url() + "/v1/models", timeout=10) as resp:
            assert resp.status == 200
        assert gw.terminate() == 0
        stray = stray_lines(gw.log())
    assert not stray, stray


def _in_flight(url: str) -> list[object]:
    with urllib.request.urlopen(url + "/v2/requests", timeout=10) as resp:
        return list(json.loads(resp.read())["requests"])
