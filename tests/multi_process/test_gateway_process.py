"""The gateway as users run it: the command line, the environment, the ready file, SIGTERM."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from bench.base.processes import REPO, child_env, spawn

MODEL = "hangup-sim"


def log_events(log: str, event: str) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("msg") == event]


def test_environment_configures_and_flags_win(tmp_path: Path) -> None:
    env = {"HANGUP_GATEWAY_SERVED_MODEL_NAME": "from-env", "HANGUP_GATEWAY_HTTP_PORT": "0"}
    with spawn("gateway_server", ["--grpc-port", "0"], tmp_path, env=env) as gw:
        models = httpx.get(f"{gw.url()}/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["from-env"]
        assert gw.terminate() == 0
    args = ["--grpc-port", "0", "--served-model-name", "from-flag"]
    with spawn("gateway_server", args, tmp_path / "b", env=env) as gw:
        assert httpx.get(f"{gw.url()}/v1/models").json()["data"][0]["id"] == "from-flag"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engine", "vllm"], "--engine vllm needs --model"),
        (["--engine", "tgi"], "--engine='tgi': expected one of sim, vllm"),
        (["--cancel-token-file", "/nonexistent/token"], "--cancel-token-file /nonexistent/token"),
        (["--workers", "0"], "--workers must be at least 1"),
    ],
)
def test_bad_configuration_exits_with_a_clear_message(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway_server", *args], env=child_env(), cwd=REPO,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert message in done.stderr


def test_an_api_processs_own_grpc_port_taken_is_named_before_anything_serves() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["--http-port", "0", "--grpc-port", "0", "--workers", "2", "--api-processes", "2",
                "--grpc-process-ports", str(port)]  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "gateway_server", *args], env=child_env(), cwd=REPO,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode != 0
    assert f"API process 0's gRPC port 127.0.0.1:{port}: Address already in use" in done.stderr


def test_a_missing_grpc_package_stops_the_gateway_instead_of_serving_without_grpc() -> None:
    """A broken install (grpcio absent) must not leave a gateway that answers HTTP with no gRPC
    listener: it exits at once, naming the package."""
    code = (
        "import sys; sys.modules['grpc'] = None; from gateway_server.cli import main; "
        "main(['--http-port', '0', '--grpc-port', '0'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), cwd=REPO, capture_output=True, timeout=60
    )
    assert done.returncode != 0
    assert b"grpc" in done.stderr


def test_cancel_token_file_protects_the_cancel_api(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    args = ["--http-port", "0", "--grpc-port", "0", "--cancel-token-file", str(token)]
    with spawn("gateway_server", args, tmp_path) as gw:
        assert httpx.post(f"{gw.url()}/v2/requests/x/cancel").status_code == 401
        authed = httpx.post(
            f"{gw.url()}/v2/requests/x/cancel", headers={"Authorization": "Bearer t0ken"}
        )
        assert authed.status_code == 404


def test_sigterm_drains_then_cancels_what_is_left(tmp_path: Path) -> None:
    """Calls that finish within --drain-timeout complete; the rest are cancelled as shutdown."""
    args = [
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--drain-timeout",
        "1.5",
        "--sim-step-base",
        "0.01",
    ]
    with spawn("gateway_server", args, tmp_path) as gw:
        url = f"{gw.url()}/v1/completions"
        results: dict[str, object] = {}
        started = {name: threading.Event() for name in ("short", "long")}

        def stream(name: str, max_tokens: int) -> None:
            body = {"model": MODEL, "prompt": "x", "max_tokens": max_tokens, "stream": True}
            events = []
            with httpx.stream("POST", url, json=body, timeout=30) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        started[name].set()
            results[name] = events

        threads = [threading.Thread(target=stream, args=("short", 60)),
                   threading.Thread(target=stream, args=("long", 4000))]  # fmt: skip
        for t in threads:
            t.start()
        for event in started.values():
            assert event.wait(10)
        assert gw.terminate(timeout=20) == 0
        for t in threads:
            t.join(10)
    short, long = results["short"], results["long"]
    assert isinstance(short, list) and short[-1] == "[DONE]"  # finished inside the drain window
    assert isinstance(long, list) and "[DONE]" not in long
    assert json.loads(long[-1])["error"]["message"] == "request cancelled (shutdown)"
    ends = log_events(gw.log(), "request_end")
    assert sorted((e["outcome"], e["reason"]) for e in ends) == [
        ("cancelled", "shutdown"),
        ("completed", None),
    ]
    assert log_events(gw.log(), "stopped")


def test_the_start_up_heap_is_frozen_before_the_gateway_says_it_is_ready(tmp_path: Path) -> None:
    """Full garbage collections must not walk what start-up loaded (with vLLM: over half a
    million objects, a pause of every stream); the freeze is logged, before ``serving``."""
    with spawn("gateway_server", ["--http-port", "0", "--grpc-port", "0"], tmp_path) as gw:
        log = gw.log()
    frozen, serving = log_events(log, "startup_heap_frozen"), log_events(log, "serving")
    assert len(frozen) == 1 and len(serving) == 1
    assert int(str(frozen[0]["objects"])) > 10_000  # the modules of a running gateway at least
    assert log.index('"startup_heap_frozen"') < log.index('"serving"')
