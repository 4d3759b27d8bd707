"""`helm test` for hangup: stream a completion through the proxy, hang up, see the cancel.

Standard library only, so it runs in any image with Python 3. Configured by environment:
HANGUP_TEST_URL (the proxy's HTTP address), HANGUP_TEST_ADMIN_URL (its admin address),
HANGUP_TEST_MODEL, HANGUP_TEST_MAX_TOKENS (long enough that the answer is still streaming when
the test hangs up, short enough for the model's context), HANGUP_TEST_TIMEOUT (seconds). Exits 0 once the proxy has counted one more
client hang-up and one more acknowledged cancel call than before the test; 1 otherwise.
With several replicas the Service may route the scrapes to other pods: it keeps looking until the
timeout, so a pass is certain to be seen but a slow pass needs fewer replicas to be quick.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
import urllib.parse
import urllib.request

ACKNOWLEDGED = ("ok", "finished")


def counter(text: str, name: str, label: str = "", values: tuple[str, ...] = ()) -> float:
    """Sum of the samples of ``name`` (whose ``label`` is one of ``values``, when given)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        series, _, value = line.rpartition(" ")
        if label and not any(f'{label}="{v}"' in series for v in values):
            continue
        total += float(value)
    return total


def counts(admin_url: str) -> tuple[float, float]:
    with urllib.request.urlopen(admin_url.rstrip("/") + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    hangups = counter(text, "hangup_proxy_client_disconnects_total")
    cancels = counter(text, "hangup_proxy_cancel_calls_total", "result", ACKNOWLEDGED)
    return hangups, cancels


def stream_and_hang_up(url: str, model: str, max_tokens: int, timeout: float) -> None:
    """Start a long streaming completion, read its first event, then close the connection."""
    target = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(target.hostname or "", target.port or 80, timeout=timeout)
    body = {"model": model, "prompt": "hang up on me", "max_tokens": max_tokens, "stream": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"FAIL: the completion answered {resp.status}: {resp.read()[:500]!r}")
    while not resp.readline().startswith(b"data:"):
        pass
    print(f"streaming through {url}; hanging up after the first event")
    resp.close()
    conn.close()


def main() -> int:
    url = os.environ["HANGUP_TEST_URL"]
    admin_url = os.environ["HANGUP_TEST_ADMIN_URL"]
    model = os.environ.get("HANGUP_TEST_MODEL", "hangup-sim")
    max_tokens = int(os.environ.get("HANGUP_TEST_MAX_TOKENS", "1000"))
    timeout = float(os.environ.get("HANGUP_TEST_TIMEOUT", "60"))
    hangups_before, cancels_before = counts(admin_url)
    stream_and_hang_up(url, model, max_tokens, timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hangups, cancels = counts(admin_url)
        if hangups > hangups_before and cancels > cancels_before:
            print(f"PASS: the proxy counted the hang-up ({hangups:g}) and the cancel ({cancels:g})")
            return 0
        time.sleep(0.5)  # polling an external system with a deadline, not waiting blindly
    print(f"FAIL: no hang-up and acknowledged cancel counted within {timeout:g}s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
