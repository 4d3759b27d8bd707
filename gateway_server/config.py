"""The gateway's configuration: one frozen dataclass, built in one place from flags and the
environment (``HANGUP_GATEWAY_<OPTION>``; flags win), with the option table both processes use
(``hangup_contract.runtime.options``). See ``hangup-gateway --help``."""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gateway_server.engine.context import EngineContext
from gateway_server.engine.handoff import WorkerRole, disaggregated, parse_roles
from gateway_server.engine.table import ENGINES, EngineName, engine_kind
from hangup_contract.runtime.connections import ConnectionLimits
from hangup_contract.runtime.files import read_secret
from hangup_contract.runtime.options import (
    ConfigError,
    Option,
    OptionTable,
    byte_size,
    choice,
    count,
    logging_level,
    new_file,
    parse_bool,
    port,
    seconds,
)

ENV_PREFIX = "HANGUP_GATEWAY_"


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    grpc_process_ports: int | None = None
    """Also serve gRPC on a port of each API process's own (see docs/operations.md): this
    process's own port; given to the supervisor, the first of ``api_processes`` (0: ephemeral)."""
    engine: EngineName = EngineName.SIM
    model: str | None = None
    served_model_name: str | None = None
    workers: int = 1
    worker_roles: str = ""
    """``prefill,decode,...``, one per worker; "": every worker ``both`` (see :attr:`roles`)."""
    api_processes: int = 1
    cancel_token: str | None = field(default=None, repr=False)
    drain_timeout: float = 30.0
    ready_file: Path | None = None
    max_body_bytes: int = 8 * 1024 * 1024
    grpc_max_message_bytes: int | None = None
    """The largest gRPC request message; None: ``max_body_bytes`` (:attr:`grpc_message_limit`)."""
    grpc_stream_max_requests: int = 16
    grpc_stream_buffer_bytes: int = 256 * 1024
    grpc_max_calls: int = 1024
    grpc_max_calls_per_client: int = 256
    max_header_bytes: int = 8190
    header_timeout: float = 30.0
    idle_timeout: float = 75.0
    max_connections: int = 4096
    body_timeout: float = 60.0
    tombstone_ttl: float = 60.0
    ended_ids_max: int = 100_000
    ended_ids_max_bytes: int = 16 * 1024 * 1024
    tombstones_max: int = 100_000
    tombstones_max_bytes: int = 16 * 1024 * 1024
    max_groups: int = 4096
    """Groups (jobs, ``hangup_contract.jobs``) held at once per API process."""
    max_group_calls: int = 4096
    """Calls of one group held at once per API process."""
    max_batch_ids: int = 1000
    """Ids one batch cancel may name."""
    responses_max_stored: int = 1000
    responses_background_per_client: int = 100
    responses_stored_per_client: int = 100
    responses_ttl: float = 3600.0
    client_header: str | None = None
    """The header naming a call's client for fair shares; None: the peer address."""
    engine_restart_backoff: float = 1.0
    engine_restart_backoff_max: float = 30.0
    engine_down_limit: float = 600.0
    loop_stall_limit: float = 10.0
    loop_stall_log: float = 1.0
    sim_faults: bool = False
    allow_open_cancel_api: bool = False
    """Serve the cancel API (and ``GET /v2/requests``, the fault switch) with no token on an
    address other than loopback: refused at start unless this says so (:func:`validate`)."""
    log_level: str = "INFO"
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    engine_settings: object = None
    """The engine's settings from its flags (its row's ``settings``: ``SimConfig``,
    ``VllmOptions``); None: its defaults."""

    @property
    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(
            self.header_timeout, self.idle_timeout, self.max_connections, self.body_timeout
        )

    @property
    def grpc_message_limit(self) -> int:
        """The gRPC receive limit: ``--grpc-max-message-bytes``, else the HTTP body limit."""
        if self.grpc_max_message_bytes is None:
            return self.max_body_bytes
        return self.grpc_max_message_bytes

    @property
    def roles(self) -> tuple[WorkerRole, ...]:
        """Each worker's role (validated by :func:`validate`)."""
        return parse_roles(self.worker_roles, self.workers)

    @property
    def engine_context(self) -> EngineContext:
        """What the engine's row makes the workers' engines from."""
        kind = engine_kind(self.engine)
        settings = kind.settings() if self.engine_settings is None else self.engine_settings
        return EngineContext(self.model, self.workers, self.roles, settings)

    @property
    def model_name(self) -> str:
        """The name clients use in ``model`` fields."""
        if self.served_model_name:
            return self.served_model_name
        name = self.model or engine_kind(self.engine).default_model
        assert name is not None  # validate() requires --model then
        return name


_OPTIONS = (
    Option("--host", str, "address the listeners bind to", metavar="HOST"),
    Option("--http-port", port, "HTTP listener port"),
    Option("--grpc-port", port, "gRPC listener port"),
    Option(
        "--grpc-process-ports",
        port,
        "also serve gRPC on PORT+k in API process k, a port of its own each, so that a client "
        "spreading calls over them (the proxy given them all in --upstream-grpc) uses every "
        "process (0: ephemeral ports)",
    ),
    Option("--engine", choice(EngineName), "the workers' engine"),
    Option(
        "--model",
        str,
        "model path or name (vllm: required); the simulated engine's model name",
        metavar="MODEL",
        unset="`hangup-sim` (`sim`); required with `vllm`",
    ),
    Option(
        "--served-model-name",
        str,
        "the name clients use in 'model' fields",
        metavar="NAME",
        unset="`--model`",
    ),
    Option("--workers", count, "engine workers"),
    Option(
        "--worker-roles",
        str,
        "each worker's role, comma-separated: prefill, decode or both (e.g. prefill,decode,decode "
        "serves disaggregated)",
        metavar="ROLE[,...]",
        unset="every worker `both`",
    ),
    Option(
        "--api-processes",
        count,
        "processes serving the API (sharing the ports and the workers; at most --workers)",
    ),
    Option(
        "--cancel-token-file",
        Path,
        "file holding the bearer token the cancel API, GET /v2/requests and the fault switch "
        "require (without one they are open to whoever reaches the port: see "
        "--allow-open-cancel-api)",
    ),
    Option(
        "--allow-open-cancel-api",
        parse_bool,
        "start on an address other than loopback without --cancel-token-file, the cancel API, "
        "GET /v2/requests (every id in flight) and the fault switch open to anyone who reaches "
        "it (refused otherwise)",
    ),
    Option("--drain-timeout", seconds, "seconds calls may finish after SIGTERM"),
    Option("--ready-file", new_file, "write the listener map here once serving (JSON)"),
    Option("--max-body-bytes", byte_size, "request body bytes (413 beyond; at least 1024)"),
    Option(
        "--grpc-max-message-bytes",
        byte_size,
        "largest gRPC request message in bytes (RESOURCE_EXHAUSTED beyond)",
        unset="`--max-body-bytes`",
    ),
    Option(
        "--grpc-stream-max-requests",
        count,
        "requests of one ModelStreamInfer stream in flight at once; the stream's next message "
        "is read when one ends",
    ),
    Option(
        "--grpc-stream-buffer-bytes",
        byte_size,
        "bytes of responses one ModelStreamInfer stream holds for a client that reads slower "
        "than they are made; its requests wait beyond",
    ),
    Option(
        "--grpc-max-calls",
        count,
        "gRPC calls in flight at once (a stream is one; RESOURCE_EXHAUSTED beyond; 0: no limit)",
    ),
    Option(
        "--grpc-max-calls-per-client",
        count,
        "gRPC calls one client may have in flight at once (RESOURCE_EXHAUSTED beyond; 0: only "
        "--grpc-max-calls bounds them)",
    ),
    Option("--max-header-bytes", byte_size, "bytes per request line or header field"),
    Option("--header-timeout", seconds, "seconds a client may take to send a request head"),
    Option("--idle-timeout", seconds, "seconds an idle keep-alive client connection stays open"),
    Option("--body-timeout", seconds, "seconds a request body may go without a byte (then 408)"),
    Option(
        "--max-connections",
        count,
        "open client connections, on the HTTP and on the gRPC listener each (0: no limit)",
    ),
    Option("--tombstone-ttl", seconds, "seconds a cancel for an unknown id waits for its request"),
    Option("--ended-ids-max", count, "ended calls' ids remembered (cancels answer finished)"),
    Option("--ended-ids-max-bytes", byte_size, "bytes those ended ids may take, entries included"),
    Option("--tombstones-max", count, "tombstones kept (cancels of ids not yet seen)"),
    Option("--tombstones-max-bytes", byte_size, "bytes the tombstones may take, entries included"),
    Option(
        "--max-groups",
        count,
        "groups (X-Hangup-Group, metadata.hangup_group) held at once per API process; a call "
        "opening one more is refused 429",
    ),
    Option(
        "--max-group-calls",
        count,
        "calls of one group held at once per API process; one more is refused 429",
    ),
    Option("--max-batch-ids", count, "ids one batch cancel (POST /v2/requests/cancel) may name"),
    Option(
        "--responses-max-stored",
        count,
        "stored Responses API responses kept (oldest dropped first); also the most background "
        "responses in flight",
    ),
    Option(
        "--responses-stored-per-client",
        count,
        "stored Responses API responses one client keeps, its own oldest dropped first when it "
        "stores another (0: only --responses-max-stored bounds them)",
    ),
    Option(
        "--responses-background-per-client",
        count,
        "background Responses API responses one client may have in flight (0: only "
        "--responses-max-stored bounds them)",
    ),
    Option("--responses-ttl", seconds, "seconds a stored Responses API response is kept"),
    Option(
        "--client-header",
        str,
        "header (gRPC: metadata key) whose last comma-separated element names a call's client "
        "for fair shares, e.g. x-forwarded-for behind the sidecar; only where every request "
        "comes through a proxy that sets it",
        metavar="HEADER",
        unset="the connection's address",
    ),
    Option(
        "--engine-restart-backoff",
        seconds,
        "seconds before a dead engine's second restart "
        "attempt (the first is at once; the wait doubles after each failure)",
    ),
    Option("--engine-restart-backoff-max", seconds, "longest wait between restart attempts"),
    Option(
        "--engine-down-limit",
        seconds,
        "seconds an engine worker may stay down (its restarts "
        "failing) before /v2/health/live answers 503 (0: never)",
    ),
    Option(
        "--loop-stall-limit",
        seconds,
        "seconds the event loop may go without running before "
        "/v2/health/live answers 503 (0: never)",
    ),
    Option(
        "--loop-stall-log",
        seconds,
        "a stall of the event loop longer than this many seconds is logged with the stack "
        "it is blocked in, and counted (0: only past --loop-stall-limit)",
    ),
    Option(
        "--sim-faults",
        parse_bool,
        "serve the simulated engine's fault switch "
        "(POST /v2/admin/workers/{worker}/fault, behind the cancel token): tests and demos",
    ),
    Option("--log-level", logging_level, "the least severe log records written (JSON on stderr)"),
    Option(
        "--tool-call-parser",
        str,
        "vLLM tool parser that reads tool calls in answers (hermes, llama3_json, ...)",
        metavar="NAME",
    ),
    Option(
        "--enable-auto-tool-choice",
        parse_bool,
        "let the model decide to call a tool (tool_choice 'auto'; needs --tool-call-parser)",
    ),
    *(option for kind in ENGINES.values() for option in kind.options),
)

# --help's sections, and the docs' (docs/gateway.md, "Command line"): every option in one.
_SECTIONS = (
    ("Listeners and processes", ("--host", "--http-port", "--grpc-port", "--api-processes",
                                 "--grpc-process-ports", "--ready-file", "--drain-timeout")),
    ("Engine", ("--engine", "--model", "--served-model-name", "--workers", "--worker-roles")),
    ("Cancel API and ids", ("--cancel-token-file", "--allow-open-cancel-api", "--tombstone-ttl",
                            "--tombstones-max", "--tombstones-max-bytes", "--ended-ids-max",
                            "--ended-ids-max-bytes", "--max-groups", "--max-group-calls",
                            "--max-batch-ids")),
    ("Limits on clients", ("--max-body-bytes", "--max-header-bytes", "--header-timeout",
                           "--idle-timeout", "--body-timeout", "--max-connections",
                           "--client-header")),
    ("gRPC calls and streams", ("--grpc-max-message-bytes", "--grpc-stream-max-requests",
                                "--grpc-stream-buffer-bytes", "--grpc-max-calls",
                                "--grpc-max-calls-per-client")),
    ("Responses API", ("--responses-max-stored", "--responses-background-per-client",
                       "--responses-stored-per-client", "--responses-ttl")),
    ("Health and observability", ("--engine-restart-backoff", "--engine-restart-backoff-max",
                                  "--engine-down-limit", "--loop-stall-limit", "--loop-stall-log",
                                  "--log-level")),
    *(
        (f"{kind.about} (--engine {name})",
         tuple(o.flag for o in kind.options) + (
             ("--tool-call-parser", "--enable-auto-tool-choice") if kind.tool_parsers else ()
         ) + (("--sim-faults",) if kind.faults else ()))
        for name, kind in ENGINES.items()
    ),
)  # fmt: skip

OPTION_TABLE = OptionTable(
    prog="hangup-gateway",
    description="hangup's model gateway: OpenAI and KServe v2 / Triton APIs over engine "
    "workers, with a cancel API. `hangup-gateway make-tiny-model DIR` writes a tiny model. "
    "Documentation: the pages 'The gateway' and 'Security' of hangup's docs.",
    usage="%(prog)s [OPTION ...]\n       %(prog)s make-tiny-model DIR",
    env_prefix=ENV_PREFIX,
    options=_OPTIONS,
    defaults={
        None: GatewayConfig,
        **{name: kind.settings for name, kind in ENGINES.items()},
    },
    sections=_SECTIONS,
    groups=tuple(ENGINES),
)


def from_args(
    argv: list[str] | None = None, environ: Mapping[str, str] | None = None
) -> GatewayConfig:
    """Parse flags and environment into a config. Raises ConfigError naming the bad option."""
    values = OPTION_TABLE.parse(
        sys.argv[1:] if argv is None else argv, os.environ if environ is None else environ
    )
    top = values[None]
    token_file = top.pop("cancel_token_file", None)
    if isinstance(token_file, Path):
        top["cancel_token"] = read_secret(token_file, "--cancel-token-file")
    if isinstance(top.get("client_header"), str):
        top["client_header"] = str(top["client_header"]).strip() or None
    engine = top.get("engine", EngineName.SIM)
    assert isinstance(engine, EngineName)
    config = GatewayConfig(**top, engine_settings=engine_kind(engine).settings(**values[engine]))
    validate(config)
    return config


def validate(config: GatewayConfig) -> None:
    if engine_kind(config.engine).default_model is None and not config.model:
        raise ConfigError(f"--engine {config.engine} needs --model (a local path or a model name)")
    if config.enable_auto_tool_choice and not config.tool_call_parser:
        raise ConfigError("--enable-auto-tool-choice requires --tool-call-parser")
    if config.tool_call_parser and not engine_kind(config.engine).tool_parsers:
        able = " or ".join(name for name, kind in ENGINES.items() if kind.tool_parsers)
        raise ConfigError(f"--tool-call-parser needs --engine {able} (it is one of vLLM's parsers)")
    if config.workers < 1:
        raise ConfigError("--workers must be at least 1")
    if not 1 <= config.api_processes <= config.workers:
        raise ConfigError(
            "--api-processes must be between 1 and --workers "
            f"({config.workers}): each API process runs its own workers"
        )
    _validate_roles(config)
    first = config.grpc_process_ports
    if first is not None and not (first == 0 or 1 <= first <= 65536 - config.api_processes):
        raise ConfigError(
            f"--grpc-process-ports={first}: the ports {first} to "
            f"{first + config.api_processes - 1} (one per API process) must be between 1 and "
            "65535 (0: ephemeral)"
        )
    for name in (
        "drain_timeout",
        "header_timeout",
        "idle_timeout",
        "max_connections",
        "grpc_max_calls",
        "grpc_max_calls_per_client",
        "body_timeout",
        "engine_restart_backoff",
        "engine_restart_backoff_max",
        "engine_down_limit",
        "loop_stall_limit",
        "loop_stall_log",
        "responses_max_stored",
        "responses_background_per_client",
        "responses_stored_per_client",
        "responses_ttl",
    ):
        if getattr(config, name) < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must not be negative")
    if (
        config.cancel_token is None
        and not config.allow_open_cancel_api
        and not loopback(config.host)
    ):
        raise ConfigError(
            f"--host {config.host} is not a loopback address and there is no "
            "--cancel-token-file: anyone who reaches the port could cancel every call, list "
            "every id in flight (GET /v2/requests) and, with --sim-faults, kill the engines. "
            "Give a token (the Helm chart always does), listen on 127.0.0.1 behind the proxy, "
            "or pass --allow-open-cancel-api to serve them open on purpose"
        )
    if config.sim_faults and not engine_kind(config.engine).faults:
        raise ConfigError("--sim-faults works with --engine sim only")
    if config.max_body_bytes < 1024:
        raise ConfigError("--max-body-bytes must be at least 1024")
    if config.grpc_max_message_bytes is not None and config.grpc_max_message_bytes < 1024:
        raise ConfigError("--grpc-max-message-bytes must be at least 1024")
    if config.grpc_stream_max_requests < 1:
        raise ConfigError("--grpc-stream-max-requests must be at least 1")
    if config.grpc_stream_buffer_bytes < 1024:
        raise ConfigError("--grpc-stream-buffer-bytes must be at least 1024")
    for name in ("max_groups", "max_group_calls", "max_batch_ids"):
        if getattr(config, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
    for memory in ("ended_ids", "tombstones"):
        flag = f"--{memory.replace('_', '-')}-max"
        if getattr(config, f"{memory}_max") < 1:
            raise ConfigError(f"{flag} must be at least 1")
        if getattr(config, f"{memory}_max_bytes") < 64 * 1024:
            raise ConfigError(f"{flag}-bytes must be at least 65536")


def loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``127.0.0.0/8``, ``::1``) or ``localhost``: only
    this machine reaches a listener there."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name: it may resolve anywhere
        return False


def _validate_roles(config: GatewayConfig) -> None:
    try:
        roles = config.roles
    except ValueError as exc:
        raise ConfigError(f"--worker-roles: {exc}") from exc
    if disaggregated(roles) and not engine_kind(config.engine).disaggregates:
        raise ConfigError(
            f"--worker-roles other than 'both' needs an engine that serves prefill and decode "
            f"legs; --engine {config.engine} does not (yet)"
        )
    if disaggregated(roles) and config.api_processes > 1:
        raise ConfigError(
            "--worker-roles with --api-processes above 1 is not supported: both legs of a "
            "call run in one API process"
        )
