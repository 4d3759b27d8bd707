"""The proxy's configuration: one frozen dataclass, built once from flags and environment.

Every flag ``--some-option`` also reads ``HANGUP_PROXY_SOME_OPTION``; a flag given on the command
line wins over the environment, which wins over the default (the option table is built and read
as the gateway's is: ``hangup_contract.runtime.options``). ``build_config(argv, environ)`` is the
only place that reads either; nothing here runs at import time.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from hangup_contract.runtime.connections import ConnectionLimits
from hangup_contract.runtime.files import read_secret
from hangup_contract.runtime.options import (
    ConfigError,
    Kind,
    Option,
    OptionTable,
    byte_size,
    choice,
    count,
    logging_level,
    new_file,
    optional_seconds,
    optional_size,
    parse_bool,
    port,
    seconds,
)
from proxy.calls.admin_paths import AdminGuard
from proxy.cancel.admin_routes import BY_ADAPTER
from proxy.upstream.grpc_target import parse_upstream_grpc

ENV_PREFIX = "HANGUP_PROXY_"
TTL_MOST = 3600.0  # --tombstone-ttl's largest value: an hour of remembered ids is plenty


class AdapterName(enum.StrEnum):
    """Which cancel adapter speaks to the upstream (``--cancel-adapter``)."""

    HANGUP = "hangup"  # the cancel contract: POST /v2/requests/{id}/cancel
    VLLM = "vllm"  # vLLM's OpenAI server: close the stream (+ POST /abort_requests if enabled)
    SGLANG = "sglang"  # SGLang: the id in the body's rid, POST /abort_request
    NONE = "none"  # no cancel call: only the upstream stream is closed
    TRITON = "triton"  # Triton: HTTP infer/generate carried over gRPC; a hang-up cancels the call


@dataclass(frozen=True)
class Config:
    host: str = "127.0.0.1"
    http_port: int = 8080
    grpc_port: int = 8081
    admin_port: int = 9090
    upstream_http: str = "http://127.0.0.1:8000"
    upstream_grpc: str = "127.0.0.1:8001"
    cancel_adapter: AdapterName = AdapterName.HANGUP
    cancel_url: str | None = None  # where cancel calls go; the upstream's HTTP address if unset
    cancel_token: str | None = None  # read from --cancel-token-file at startup
    # A pool the hangup cancel call asks all at once (proxy.cancel.pool): base URLs, each host
    # resolved to all its addresses (a headless Service: every pod), again every refresh seconds.
    cancel_pool: tuple[str, ...] = ()
    cancel_pool_refresh: float = 5.0
    cancel_pool_max: int = 64  # members asked at most per cancel
    vllm_abort_endpoint: bool = False  # vllm adapter: also call POST /abort_requests
    cancel_deadline: float = 10.0  # seconds from hang-up after which a cancel is given up
    cancel_attempt_timeout: float = 2.0
    cancel_backoff: float = 0.05  # first retry delay; doubles up to cancel_backoff_max
    cancel_backoff_max: float = 1.0
    cancel_concurrency: int = 64  # cancel calls in flight at once; the rest wait their turn
    stream_close_grace: float = 0.5  # longest wait for a cancel's answer before closing upstream
    # The proxy's own cancel by id (proxy.calls.held): on when cancel_token is set. How long a
    # cancel for an id it does not hold waits for its call, and a finished call's id is remembered.
    tombstone_ttl: float = 60.0
    # What the proxy remembers of ids, per worker, each memory bounded in count and in bytes.
    ended_ids_max: int = 65536
    ended_ids_max_bytes: int = 16 << 20
    tombstones_max: int = 65536
    tombstones_max_bytes: int = 16 << 20
    # Jobs (hangup_contract.jobs): groups held, calls per group (per worker), ids per batch.
    max_groups: int = 4096
    max_group_calls: int = 4096
    max_batch_ids: int = 1000
    drain_timeout: float = 30.0
    workers: int = 1  # processes sharing the HTTP and gRPC ports (proxy.workers) when > 1
    reuse_port: bool = False  # set in each worker: its gRPC listener shares the port
    # (SO_REUSEPORT); its HTTP listener is the supervisor's shared socket (proxy.http.listener)
    ready_file: Path | None = None
    max_request_duration: float | None = None  # None: no proxy-side limit
    max_concurrent_streams: int = 1024  # 0: no limit
    max_header_size: int = 8190  # bytes per request line or header field
    max_headers: int = 128
    max_body_size: int | None = 8 * 1024 * 1024  # request body bytes (the gateway's); None: none
    header_timeout: float = 30.0  # seconds to send a request head once begun (0: no limit)
    idle_timeout: float = 75.0  # seconds a keep-alive connection may sit idle (0: no limit)
    max_connections: int = 4096  # open client connections per HTTP listener (0: no limit)
    body_timeout: float = 60.0  # seconds between two reads of a request body (0: no limit)
    upstream_connect_timeout: float = 5.0
    trust_client_request_id: bool = False
    # GET paths relayed as scrapes (Prometheus, an Endpoint Picker every 50 ms): no call, no
    # log line, no cancel; counted in hangup_proxy_scrapes_total.
    scrape_paths: tuple[str, ...] = ("/metrics", "/metrics/pool")
    # Admin routes of the server behind that clients may reach (proxy.cancel.admin_routes): by
    # default none; each opened on purpose, for operators who route admin traffic through here.
    allow_admin_paths: tuple[str, ...] = ()
    loop_stall_log: float = 1.0  # seconds the event loop may stall before it is logged (0: never)
    log_level: str = "INFO"

    @property
    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(
            self.header_timeout, self.idle_timeout, self.max_connections, self.body_timeout
        )

    @property
    def cancel_base_url(self) -> str:
        return (self.cancel_url or self.upstream_http).rstrip("/")

    def admin_guard(self) -> AdminGuard:
        """What refuses the admin routes of the server behind (``--cancel-adapter``'s), less
        those opened by ``--allow-admin-path``."""
        return AdminGuard(BY_ADAPTER[self.cancel_adapter.value], self.allow_admin_paths)


def parse_urls(text: str) -> tuple[str, ...]:
    """``http://a:1,http://b:2`` as a tuple; empty for none. Each must be ``http://host:port``
    (an address list, resolved: TLS would need each member's name)."""
    urls = tuple(u.strip().rstrip("/") for u in text.split(",") if u.strip())
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"not http://host:port: {url!r}")
    return urls


def parse_paths(text: str) -> tuple[str, ...]:
    """``/a,/b`` as ``("/a", "/b")``; empty for none. Each must be an absolute path."""
    paths = tuple(p.strip() for p in text.split(",") if p.strip())
    for path in paths:
        if not path.startswith("/"):
            raise ValueError(f"not a path (it must start with /): {path!r}")
    return paths


def _ttl(text: str) -> float:
    value = float(text)
    if not 0 < value <= TTL_MOST:  # nan fails both comparisons
        raise ValueError(text)
    return value


_OPTIONS = (
    Option("--host", str, "address every listener binds to", metavar="HOST"),
    Option("--http-port", port, "HTTP/1.1 listener port"),
    Option("--grpc-port", port, "gRPC listener port"),
    Option("--admin-port", port, "admin listener port: /metrics, /healthz, /readyz"),
    Option("--upstream-http", str, "the upstream's HTTP base URL", metavar="URL"),
    Option(
        "--upstream-grpc",
        parse_upstream_grpc,
        "the upstream's gRPC host:port, or several ip:port serving alike (calls spread over "
        "them: a hangup gateway's --grpc-process-ports)",
        metavar="HOST:PORT[,...]",
    ),
    Option(
        "--cancel-adapter",
        choice(AdapterName),
        "how a hang-up is cancelled upstream: hangup (the gateway's cancel API), vllm (vllm "
        "serve), sglang, triton, or none (only the upstream stream is closed)",
    ),
    Option(
        "--cancel-url",
        str,
        "base URL for cancel calls",
        metavar="URL",
        unset="`--upstream-http`",
    ),
    Option(
        "--cancel-token-file",
        Path,
        "file holding the cancel API's bearer token (also turns on the proxy's own cancel by id)",
    ),
    Option(
        "--cancel-pool",
        parse_urls,
        "hangup adapter: ask every member of this pool at once (comma-separated http://host:port; "
        "each host resolved to all its addresses, such as a headless Service's pods)",
        metavar="URL[,...]",
    ),
    Option("--cancel-pool-refresh", seconds, "seconds between resolutions of --cancel-pool"),
    Option("--cancel-pool-max", count, "members of --cancel-pool asked at most per cancel"),
    Option(
        "--vllm-abort-endpoint",
        parse_bool,
        "vllm adapter: also call POST /abort_requests (needs VLLM_SERVER_DEV_MODE=1 upstream)",
    ),
    Option("--cancel-deadline", seconds, "seconds after a hang-up to keep retrying its cancel"),
    Option("--cancel-attempt-timeout", seconds, "seconds one cancel attempt may take"),
    Option("--cancel-backoff", seconds, "first retry delay in seconds (doubles each retry)"),
    Option("--cancel-backoff-max", seconds, "longest retry delay in seconds"),
    Option("--cancel-concurrency", count, "cancel calls in flight at once"),
    Option(
        "--stream-close-grace",
        seconds,
        "seconds an upstream stream stays open waiting for its cancel call's answer",
    ),
    Option(
        "--tombstone-ttl",
        Kind(_ttl, "SECONDS", f"seconds, more than 0 and at most {TTL_MOST:g}"),
        "seconds a cancel by id for a call not held waits for it, and an ended call's id is "
        f"remembered (more than 0, at most {TTL_MOST:g})",
    ),
    Option("--ended-ids-max", count, "ended calls' ids remembered at most, per worker"),
    Option("--ended-ids-max-bytes", byte_size, "bytes of ended calls' ids remembered, per worker"),
    Option("--tombstones-max", count, "tombstones (cancels that beat their call) kept, per worker"),
    Option("--tombstones-max-bytes", byte_size, "bytes of tombstones kept, per worker"),
    Option(
        "--max-groups",
        count,
        "groups (X-Hangup-Group) held at once, per worker; a call opening one more is refused 429",
    ),
    Option("--max-group-calls", count, "calls of one group held at once, per worker (then 429)"),
    Option("--max-batch-ids", count, "ids one batch cancel (POST /v2/requests/cancel) may name"),
    Option("--drain-timeout", seconds, "seconds calls may finish after SIGTERM"),
    Option("--workers", count, "processes relaying calls on the shared ports (1 to 256)"),
    Option("--ready-file", new_file, "write the listener map here once serving (JSON)"),
    Option("--max-request-duration", optional_seconds, "seconds one call may last"),
    Option("--max-concurrent-streams", count, "calls in flight at once (0: no limit)"),
    Option(
        "--max-header-bytes",
        byte_size,
        "bytes per request line or header field",
        field="max_header_size",
        aliases=("--max-header-size",),
    ),
    Option("--max-headers", count, "header fields per request"),
    Option("--max-body-size", optional_size, "request body bytes, and gRPC message bytes"),
    Option("--header-timeout", seconds, "seconds a client may take to send a request head"),
    Option("--idle-timeout", seconds, "seconds an idle keep-alive client connection stays open"),
    Option("--body-timeout", seconds, "seconds a request body may go without a byte (then 408)"),
    Option("--max-connections", count, "open client connections per HTTP listener (0: no limit)"),
    Option("--upstream-connect-timeout", seconds, "seconds to connect to the upstream"),
    Option(
        "--trust-client-request-id",
        parse_bool,
        "use the client's X-Request-Id upstream (an id another call holds is refused 409)",
    ),
    Option(
        "--loop-stall-log",
        seconds,
        "a stall of the event loop longer than this many seconds is logged with the stack it is "
        "blocked in, and counted (0: never)",
    ),
    Option(
        "--scrape-paths",
        parse_paths,
        "comma-separated GET paths relayed as metric scrapes: not logged or counted as calls",
        metavar="PATH[,...]",
    ),
    Option(
        "--allow-admin-path",
        parse_paths,
        "an admin route of the server behind that clients may reach (refused by default; the "
        "Security page lists them), or several separated by commas",
        field="allow_admin_paths",
        repeatable=True,
        metavar="ROUTE",
    ),
    Option("--log-level", logging_level, "the least severe log records written (JSON on stderr)"),
)

# --help's sections, and the docs' (docs/proxy.md, "Command line"): every option in one.
_SECTIONS = (
    ("Listeners", ("--host", "--http-port", "--grpc-port", "--admin-port", "--workers",
                   "--ready-file", "--drain-timeout")),
    ("Upstream", ("--upstream-http", "--upstream-grpc", "--upstream-connect-timeout",
                  "--trust-client-request-id", "--scrape-paths", "--allow-admin-path")),
    ("Cancel calls", ("--cancel-adapter", "--vllm-abort-endpoint", "--cancel-url",
                      "--cancel-token-file", "--cancel-pool", "--cancel-pool-refresh",
                      "--cancel-pool-max", "--cancel-deadline", "--cancel-attempt-timeout",
                      "--cancel-backoff", "--cancel-backoff-max", "--cancel-concurrency",
                      "--stream-close-grace")),
    ("Cancel by id: ids remembered, jobs", ("--tombstone-ttl", "--ended-ids-max",
                                             "--ended-ids-max-bytes", "--tombstones-max",
                                             "--tombstones-max-bytes", "--max-groups",
                                             "--max-group-calls", "--max-batch-ids")),
    ("Limits on clients", ("--max-request-duration", "--max-concurrent-streams",
                           "--max-header-bytes", "--max-headers", "--max-body-size",
                           "--header-timeout", "--idle-timeout", "--body-timeout",
                           "--max-connections")),
    ("Observability", ("--loop-stall-log", "--log-level")),
)  # fmt: skip


OPTION_TABLE = OptionTable(
    prog="hangup-proxy",
    description="Sidecar proxy that turns every client hang-up into an upstream cancel call. "
    "Documentation: the pages 'The proxy and its adapters' and 'Security' of hangup's docs.",
    env_prefix=ENV_PREFIX,
    options=_OPTIONS,
    defaults={None: Config},
    sections=_SECTIONS,
)


def build_config(argv: Sequence[str], environ: Mapping[str, str]) -> Config:
    """The configuration named by ``argv`` over ``environ`` over the defaults.

    Raises ``ConfigError`` naming the flag (or variable) and the bad value.
    """
    values = OPTION_TABLE.parse(argv, environ)[None]
    token_file = values.pop("cancel_token_file", None)
    if isinstance(token_file, Path):
        values["cancel_token"] = read_secret(token_file, "--cancel-token-file")
    config = Config(**values)
    _validate(config)
    return config


def _validate(config: Config) -> None:
    for name in ("upstream_http", "cancel_url"):
        url = getattr(config, name)
        if url is not None and (
            urlsplit(url).scheme not in {"http", "https"} or not urlsplit(url).netloc
        ):
            raise ConfigError(f"--{name.replace('_', '-')}={url!r}: expected http://host:port")
    positive = (
        "cancel_deadline",
        "cancel_attempt_timeout",
        "cancel_backoff",
        "cancel_backoff_max",
        "cancel_concurrency",
        "cancel_pool_refresh",
        "cancel_pool_max",
        "upstream_connect_timeout",
        "stream_close_grace",
        "max_header_size",
        "max_headers",
    )
    for name in positive:
        if getattr(config, name) <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive")
    for name in (
        "drain_timeout",
        "max_concurrent_streams",
        "header_timeout",
        "idle_timeout",
        "max_connections",
        "body_timeout",
        "loop_stall_log",
    ):
        if getattr(config, name) < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must not be negative")
    _validate_memory(config)
    if config.cancel_pool and config.cancel_adapter is not AdapterName.HANGUP:
        raise ConfigError("--cancel-pool is for --cancel-adapter hangup (the gateway's cancel API)")
    if config.cancel_pool and config.cancel_url:
        raise ConfigError("--cancel-pool and --cancel-url name two cancel targets: give one")
    try:
        config.admin_guard()
    except ValueError as exc:
        raise ConfigError(
            f"--allow-admin-path: {exc} (--cancel-adapter {config.cancel_adapter.value}; "
            "the Security page lists its routes)"
        ) from exc
    if not 1 <= config.workers <= 256:
        raise ConfigError("--workers must be between 1 and 256")


def _validate_memory(config: Config) -> None:
    """The bounds on what the proxy remembers of ids (``proxy.calls.held``)."""
    ttl = config.tombstone_ttl
    if not 0 < ttl <= TTL_MOST:  # nan fails both comparisons
        raise ConfigError(
            f"--tombstone-ttl={ttl!r}: expected seconds, more than 0 and at most {TTL_MOST:g}"
        )
    for name in (
        "ended_ids_max", "ended_ids_max_bytes", "tombstones_max", "tombstones_max_bytes",
        "max_groups", "max_group_calls", "max_batch_ids",
    ):  # fmt: skip
        if getattr(config, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
