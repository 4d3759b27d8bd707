"""`helm test` for hangup: a long call through the sidecar, hung up on; is the hang-up through?

Standard library only, so it runs in any image with Python 3. Configured by environment (the
chart's test pod sets every variable from its values and the `server` preset):

- HANGUP_TEST_URL, HANGUP_TEST_ADMIN_URL, HANGUP_TEST_SERVER_METRICS_URL: the sidecar's HTTP
  address, its admin address, and where the server's own /metrics is read (through the sidecar's
  HTTP port, or Triton's metrics port), each with ``{host}`` for the host;
  HANGUP_TEST_HOST: the Service's name; or HANGUP_TEST_PODS: a headless Service's name, whose
  addresses (every ready pod) are checked one by one;
- HANGUP_TEST_KIND (openai, triton, truss), HANGUP_TEST_MODEL (openai: empty, the first of GET
  /v1/models), HANGUP_TEST_PATH and HANGUP_TEST_BODY (empty: the kind's; ``{model}`` and
  ``{maxTokens}`` are filled in), HANGUP_TEST_MAX_TOKENS;
- HANGUP_TEST_HANG_UP_AFTER: seconds after which a call that has sent nothing yet is hung up on
  (one that sends is hung up on at its first bytes); HANGUP_TEST_END_WITHIN: seconds the
  server's gauges have to be back down after it; HANGUP_TEST_TIMEOUT: seconds for the rest;
- HANGUP_TEST_CANCEL_CALLS ("1": the adapter makes a cancel call, which must be acknowledged);
  HANGUP_TEST_SERVER_INFLIGHT, HANGUP_TEST_SERVER_COUNTER: JSON lists of series selectors
  (``name`` or ``name{label="value",...}``, summed): gauges that rise while the call runs and
  are back down within HANGUP_TEST_END_WITHIN of the hang-up; counters that grow.

Passes (exit 0) once, for each pod checked: the sidecar counted the client's hang-up and
cancelled the upstream call (``hangup_proxy_client_disconnects_total``,
``hangup_proxy_cancels_total{reason="client_disconnect"}``), the cancel call was acknowledged
where there is one, and the server's own metrics showed it. Fails (exit 1) naming what was not
seen. Run it on an idle release: other calls move the same gauges.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import select
import socket
import sys
import time
import urllib.parse
from dataclasses import dataclass

ACKNOWLEDGED = ("ok", "finished")
SELECTOR = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')
BODIES = {
    "openai": '{"model": "{model}", "prompt": "hang up on me", "max_tokens": {maxTokens}, '
    '"stream": true, "ignore_eos": true}',
    "triton": '{"text_input": "hang up on me", "stream": false, "sampling_parameters": '
    '"{\\"max_tokens\\": {maxTokens}, \\"ignore_eos\\": true}"}',
    "truss": '{"prompt": "hang up on me", "max_tokens": {maxTokens}}',
}
PATHS = {
    "openai": "/v1/completions",
    "triton": "/v2/models/{model}/generate",  # not streamed: what Triton's HTTP never cancels
    "truss": "/v1/models/model:predict",
}


class Failed(Exception):
    """What the test did not see; the message says what to look at."""


def parse_selector(text: str) -> tuple[str, dict[str, str]]:
    found = SELECTOR.match(text.strip())
    if not found:
        raise Failed(f"not a series selector: {text!r} (name or name{{label=\"value\"}})")
    return found.group(1), dict(LABEL.findall(found.group(2) or ""))


def total(text: str, selector: str) -> float | None:
    """Sum of the samples ``selector`` names in a Prometheus text page; None if it has none."""
    name, labels = parse_selector(selector)
    found = None
    for line in text.splitlines():
        if not line.startswith((name + "{", name + " ")):
            continue
        series, _, value = line.rpartition(" ")
        have = dict(LABEL.findall(series[len(name) :]))
        if all(have.get(k) == v for k, v in labels.items()):
            found = (found or 0.0) + float(value)
    return found


class Scraper:
    """GET one URL again and again on one keep-alive connection (one pod behind a Service)."""

    def __init__(self, url: str) -> None:
        self.url = urllib.parse.urlsplit(url)
        self.conn: http.client.HTTPConnection | None = None

    def text(self) -> str:
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.url.hostname or "", self.url.port or 80,
                                                       timeout=10)  # fmt: skip
            try:
                self.conn.request("GET", self.url.path or "/")
                resp = self.conn.getresponse()
                body = resp.read().decode(errors="replace")
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise
                continue
            if resp.status != 200:
                raise Failed(f"GET {self.url.geturl()} answered {resp.status}: {body[:300]}")
            return body
        raise AssertionError("unreachable")

    def sum(self, selectors: list[str]) -> float:
        text = self.text()
        found = [total(text, s) for s in selectors]
        if all(f is None for f in found):
            raise Failed(f"{self.url.geturl()} exports none of {selectors}: set test.serverInflight"
                         " / test.serverCounter to what your server exports, or [] to check only"
                         " the sidecar")  # fmt: skip
        return sum(f or 0.0 for f in found)


class Call:
    """One call through the sidecar, on a socket of its own, hung up on by closing it."""

    def __init__(self, url: str, path: str, body: str) -> None:
        target = urllib.parse.urlsplit(url)
        self.sock = socket.create_connection((target.hostname, target.port or 80), timeout=10)
        head = (f"POST {path} HTTP/1.1\r\nHost: {target.hostname}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body.encode())}\r\n\r\n")
        self.sock.sendall(head.encode() + body.encode())
        self.seen = b""

    def first_bytes(self, within: float) -> bool:
        """Wait up to ``within`` seconds for the answer's first bytes; whether any came. An answer
        that is not a 200, or that ends before the test hangs up, fails the test."""
        readable, _, _ = select.select([self.sock], [], [], within)
        if not readable:
            return False
        chunk = self.sock.recv(65536)
        self.seen += chunk
        while b"\r\n\r\n" not in self.seen and chunk:
            chunk = self.sock.recv(65536)
            self.seen += chunk
        status = self.seen.split(b"\r\n", 1)[0]
        if not status.startswith(b"HTTP/1.1 200"):
            raise Failed(f"the call answered {self.seen[:600]!r}")
        if not chunk:
            raise Failed("the call ended before the test hung up: ask for more (test.maxTokens)")
        return True

    def hang_up(self) -> None:
        self.sock.close()


def first_model(url: str) -> str:
    target = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(target.hostname or "", target.port or 80, timeout=10)
    try:
        conn.request("GET", "/v1/models")
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise Failed(f"GET /v1/models answered {resp.status}: set test.model")
    return str(json.loads(body)["data"][0]["id"])


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


@dataclass(frozen=True)
class Plan:
    """What the test calls at one pod (or the Service) and what it reads there."""

    url: str
    admin_url: str
    metrics_url: str
    path: str
    body: str
    inflight: list[str]
    counters: list[str]
    cancel_calls: bool
    hang_up_after: float
    end_within: float
    timeout: float


def plan(host: str) -> Plan:
    """The test's plan at ``host``, from the environment the chart sets."""
    url, admin_url, metrics_url = (env(n).replace("{host}", host) for n in (
        "HANGUP_TEST_URL", "HANGUP_TEST_ADMIN_URL", "HANGUP_TEST_SERVER_METRICS_URL"))  # fmt: skip
    kind = env("HANGUP_TEST_KIND", "openai")
    model = env("HANGUP_TEST_MODEL")
    if not model and kind == "openai":
        model = first_model(url)
    if not model and kind == "triton":
        raise Failed("set test.model: the Triton model to call")
    fill = {"{model}": model, "{maxTokens}": env("HANGUP_TEST_MAX_TOKENS", "1000")}
    path, body = env("HANGUP_TEST_PATH") or PATHS[kind], env("HANGUP_TEST_BODY") or BODIES[kind]
    for key, value in fill.items():
        path, body = path.replace(key, value), body.replace(key, value)
    return Plan(url, admin_url, metrics_url, path, body,
                json.loads(env("HANGUP_TEST_SERVER_INFLIGHT", "[]")),
                json.loads(env("HANGUP_TEST_SERVER_COUNTER", "[]")),
                env("HANGUP_TEST_CANCEL_CALLS") == "1",
                float(env("HANGUP_TEST_HANG_UP_AFTER", "2")),
                float(env("HANGUP_TEST_END_WITHIN", "5")),
                float(env("HANGUP_TEST_TIMEOUT", "60")))  # fmt: skip


class Readings:
    """The sidecar's counters and the server's metrics, before the call and after it."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.admin, self.server = Scraper(plan.admin_url + "/metrics"), Scraper(plan.metrics_url)
        self.before = self.sidecar()
        self.gauge_before = self.server.sum(plan.inflight) if plan.inflight else 0.0
        self.counter_before = self.server.sum(plan.counters) if plan.counters else 0.0

    def sidecar(self) -> tuple[float, float, float]:
        """Client hang-ups, upstream calls it cancelled for one, cancel calls acknowledged."""
        text = self.admin.text()
        return (total(text, "hangup_proxy_client_disconnects_total") or 0.0,
                total(text, 'hangup_proxy_cancels_total{reason="client_disconnect"}') or 0.0,
                sum(total(text, f'hangup_proxy_cancel_calls_total{{result="{r}"}}') or 0.0
                    for r in ACKNOWLEDGED))  # fmt: skip

    def wait_rise(self) -> None:
        """Until the server's gauges count the call running (they must, to show its end)."""
        deadline = time.monotonic() + self.plan.timeout
        while self.server.sum(self.plan.inflight) <= self.gauge_before:
            if time.monotonic() > deadline:
                raise Failed(f"the server's {self.plan.inflight} did not rise while the call ran"
                             " (with several pods, enable service.headless)")  # fmt: skip
            time.sleep(0.2)  # polling a server's metrics, with a deadline

    def missing(self, since_hang_up: float) -> list[str]:
        """What is not seen yet; Failed once the server's gauges outlast test.endWithinSeconds."""
        p, now, missing = self.plan, self.sidecar(), []
        if now[0] <= self.before[0]:
            missing.append("the sidecar's count of the client's hang-up")
        if now[1] <= self.before[1]:
            missing.append("the sidecar's cancel of the upstream call")
        if p.cancel_calls and now[2] <= self.before[2]:
            missing.append("an acknowledged cancel call")
        if p.counters and self.server.sum(p.counters) <= self.counter_before:
            missing.append(f"the server's {p.counters} growing")
        if p.inflight and self.server.sum(p.inflight) > self.gauge_before:
            if since_hang_up > p.end_within:
                raise Failed(f"the server's {p.inflight} still count the call {p.end_within:g} s"
                             " after the hang-up: it did not reach the server")  # fmt: skip
            missing.append(f"the server's {p.inflight} back down")
        return missing


def check(host: str) -> list[str]:
    """The test against the pod (or Service) at ``host``: what it proved, or Failed."""
    p = plan(host)
    readings = Readings(p)
    call = Call(p.url, p.path, p.body)
    try:
        sent = call.first_bytes(p.hang_up_after)
        if p.inflight:
            readings.wait_rise()
    finally:
        call.hang_up()
    hung_up = time.monotonic()
    print(f"{host}: {'streaming' if sent else 'waiting'} on {p.path}; hung up")
    while missing := readings.missing(time.monotonic() - hung_up):
        if time.monotonic() - hung_up > p.timeout:
            raise Failed(f"not seen within {p.timeout:g} s: {'; '.join(missing)}")
        time.sleep(0.2)  # polling the sidecar's and the server's metrics, with a deadline
    proved = ["the sidecar counted the hang-up and cancelled the upstream call"]
    if p.cancel_calls:
        proved.append("its cancel call was acknowledged")
    if p.counters:
        proved.append(f"the server's {p.counters} grew")
    if p.inflight:
        proved.append(f"the server's {p.inflight} were back down within {p.end_within:g} s")
    return proved


def hosts() -> list[str]:
    pods = env("HANGUP_TEST_PODS")
    if not pods:
        return [env("HANGUP_TEST_HOST")]
    found = sorted({a[4][0] for a in socket.getaddrinfo(pods, None, proto=socket.IPPROTO_TCP)})
    if not found:
        raise Failed(f"{pods} names no ready pod")
    return found


def main() -> int:
    try:
        for host in hosts():
            host = f"[{host}]" if ":" in host else host  # an IPv6 pod address
            print(f"PASS {host}: " + "; ".join(check(host)))
    except Failed as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
