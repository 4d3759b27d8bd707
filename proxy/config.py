"""The proxy's configuration: one frozen dataclass, built once from flags and environment.

Every flag ``--some-option`` also reads ``HANGUP_PROXY_SOME_OPTION``; a flag given on the command
line wins over the environment, which wins over the default. ``build_config(argv, environ)`` is
the only place that reads either; nothing here runs at import time.
"""

from __future__ import annotations

import argparse
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from proxy.errors import ConfigError

ENV_PREFIX = "HANGUP_PROXY_"


class AdapterName(enum.StrEnum):
    """Which cancel adapter speaks to the upstream (``--cancel-adapter``)."""

    HANGUP = "hangup"  # DESIGN.md's cancel API: POST /v2/requests/{id}/cancel
    NONE = "none"  # no cancel call: only the upstream stream is closed


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
    cancel_deadline: float = 10.0  # seconds from hang-up after which a cancel is given up
    cancel_attempt_timeout: float = 2.0
    cancel_backoff: float = 0.05  # first retry delay; doubles up to cancel_backoff_max
    cancel_backoff_max: float = 1.0
    cancel_concurrency: int = 64  # cancel calls in flight at once; the rest wait their turn
    stream_close_grace: float = 0.5  # longest wait for a cancel's answer before closing upstream
    drain_timeout: float = 30.0
    ready_file: Path | None = None
    max_request_duration: float | None = None  # None: no proxy-side limit
    max_concurrent_streams: int = 1024  # 0: no limit
    max_header_size: int = 8190  # bytes per request line or header field
    max_headers: int = 128
    max_body_size: int | None = None  # request body bytes; None: no limit
    upstream_connect_timeout: float = 5.0
    trust_client_request_id: bool = False
    log_level: str = "INFO"

    @property
    def cancel_base_url(self) -> str:
        return (self.cancel_url or self.upstream_http).rstrip("/")


@dataclass(frozen=True)
class _Option:
    flag: str
    parse: Callable[[str], object]
    help: str

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _optional_seconds(text: str) -> float | None:
    value = float(text)
    return None if value <= 0 else value


def _optional_size(text: str) -> int | None:
    value = int(text)
    return None if value <= 0 else value


_OPTIONS = (
    _Option("--host", str, "address every listener binds to"),
    _Option("--http-port", int, "HTTP/1.1 listener port (0: ephemeral)"),
    _Option("--grpc-port", int, "gRPC listener port (0: ephemeral)"),
    _Option("--admin-port", int, "admin listener: /metrics, /healthz, /readyz"),
    _Option("--upstream-http", str, "the upstream's HTTP base URL"),
    _Option("--upstream-grpc", str, "the upstream's gRPC host:port"),
    _Option("--cancel-adapter", AdapterName, "hangup (explicit cancel call) or none"),
    _Option("--cancel-url", str, "base URL for cancel calls (default: --upstream-http)"),
    _Option("--cancel-token-file", Path, "file holding the cancel API's bearer token"),
    _Option("--cancel-deadline", float, "seconds after a hang-up to keep retrying its cancel"),
    _Option("--cancel-attempt-timeout", float, "seconds one cancel attempt may take"),
    _Option("--cancel-backoff", float, "first retry delay in seconds (doubles each retry)"),
    _Option("--cancel-backoff-max", float, "longest retry delay in seconds"),
    _Option("--cancel-concurrency", int, "cancel calls in flight at once"),
    _Option(
        "--stream-close-grace",
        float,
        "seconds an upstream stream stays open waiting for its cancel call's answer",
    ),
    _Option("--drain-timeout", float, "seconds calls may finish after SIGTERM"),
    _Option("--ready-file", Path, "write the listener map here once serving"),
    _Option("--max-request-duration", _optional_seconds, "seconds per call (0: no limit)"),
    _Option("--max-concurrent-streams", int, "calls in flight at once (0: no limit)"),
    _Option("--max-header-size", int, "bytes per request line or header field"),
    _Option("--max-headers", int, "header fields per request"),
    _Option("--max-body-size", _optional_size, "request body bytes (0: no limit)"),
    _Option("--upstream-connect-timeout", float, "seconds to connect to the upstream"),
    _Option("--trust-client-request-id", _bool, "use the client's X-Request-Id upstream"),
    _Option("--log-level", str, "DEBUG, INFO, WARNING or ERROR"),
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hangup-proxy",
        description="Sidecar proxy that turns every client hang-up into an upstream cancel call.",
        epilog=f"Every option also reads {ENV_PREFIX}<OPTION> (e.g. {ENV_PREFIX}HTTP_PORT).",
    )
    for option in _OPTIONS:
        if option.parse is _bool:  # a bare flag means true; a value may still be given
            parser.add_argument(
                option.flag, dest=option.dest, nargs="?", const="true", help=option.help
            )
        else:
            parser.add_argument(option.flag, dest=option.dest, default=None, help=option.help)
    return parser


def build_config(argv: Sequence[str], environ: Mapping[str, str]) -> Config:
    """The configuration named by ``argv`` over ``environ`` over the defaults.

    Raises ``ConfigError`` naming the flag (or variable) and the bad value.
    """
    given = vars(_parser().parse_args(list(argv)))
    values: dict[str, object] = {}
    for option in _OPTIONS:
        raw, source = given[option.dest], option.flag
        if raw is None and option.env in environ:
            raw, source = environ[option.env], option.env
        if raw is None:
            continue
        try:
            values[option.dest] = option.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{source}={raw!r}: {exc}") from exc
    token_file = values.pop("cancel_token_file", None)
    if isinstance(token_file, Path):
        values["cancel_token"] = _read_token(token_file)
    config = Config(**values)  # type: ignore[arg-type]
    _validate(config)
    return config


def _read_token(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"--cancel-token-file {path}: {exc.strerror}") from exc
    if not token:
        raise ConfigError(f"--cancel-token-file {path} is empty")
    return token


def _validate(config: Config) -> None:
    for name in ("upstream_http", "cancel_url"):
        url = getattr(config, name)
        if url is not None and (
            urlsplit(url).scheme not in {"http", "https"} or not urlsplit(url).netloc
        ):
            raise ConfigError(f"--{name.replace('_', '-')}={url!r}: expected http://host:port")
    for name in ("http_port", "grpc_port", "admin_port"):
        if not 0 <= getattr(config, name) <= 65535:
            raise ConfigError(f"--{name.replace('_', '-')} must be between 0 and 65535")
    positive = (
        "cancel_deadline",
        "cancel_attempt_timeout",
        "cancel_backoff",
        "cancel_backoff_max",
        "cancel_concurrency",
        "upstream_connect_timeout",
        "stream_close_grace",
        "max_header_size",
        "max_headers",
    )
    for name in positive:
        if getattr(config, name) <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive")
    if config.drain_timeout < 0 or config.max_concurrent_streams < 0:
        raise ConfigError("--drain-timeout and --max-concurrent-streams must not be negative")
    if config.log_level.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise ConfigError(
            f"--log-level={config.log_level!r}: expected DEBUG, INFO, WARNING or ERROR"
        )
