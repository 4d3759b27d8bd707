"""The gateway's configuration: one frozen dataclass, built in one place from flags and the
environment (``HANGUP_GATEWAY_<OPTION>``; flags win). See ``hangup-gateway --help``."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway_server.engine.sim import SimConfig
from gateway_server.engine.vllm_options import VllmOptions, add_vllm_arguments

ENV_PREFIX = "HANGUP_GATEWAY_"
DEFAULT_SIM_MODEL = "hangup-sim"


class ConfigError(Exception):
    """The configuration is unusable; the message says which option and why."""


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    engine: str = "sim"
    model: str | None = None
    served_model_name: str | None = None
    workers: int = 1
    cancel_token: str | None = field(default=None, repr=False)
    drain_timeout: float = 30.0
    ready_file: Path | None = None
    max_body_bytes: int = 8 * 1024 * 1024
    max_header_bytes: int = 8190
    tombstone_ttl: float = 60.0
    log_level: str = "INFO"
    sim: SimConfig = field(default_factory=SimConfig)
    vllm: VllmOptions = field(default_factory=VllmOptions)

    @property
    def model_name(self) -> str:
        """The name clients use in ``model`` fields."""
        if self.served_model_name:
            return self.served_model_name
        if self.engine == "sim":
            return self.model or DEFAULT_SIM_MODEL
        assert self.model is not None
        return self.model


def parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The argument parser; every default comes from ``environ`` when set there."""

    def env(name: str, default: Any) -> Any:
        return environ.get(ENV_PREFIX + name.upper(), default)

    p = argparse.ArgumentParser(
        prog="hangup-gateway",
        description="hangup's model gateway: OpenAI and KServe v2 / Triton APIs over engine "
        "workers, with a cancel API. `hangup-gateway make-tiny-model DIR` writes a tiny model.",
    )
    p.add_argument("--host", default=env("host", "127.0.0.1"))
    p.add_argument("--http-port", type=int, default=env("http_port", 8000))
    p.add_argument("--grpc-port", type=int, default=env("grpc_port", 8001))
    p.add_argument("--engine", choices=["sim", "vllm"], default=env("engine", "sim"))
    p.add_argument("--model", default=env("model", None), help="model path or name (vllm)")
    p.add_argument("--served-model-name", default=env("served_model_name", None))
    p.add_argument("--workers", type=int, default=env("workers", 1), help="engine workers")
    p.add_argument("--cancel-token-file", type=Path, default=env("cancel_token_file", None),
                   help="file holding the bearer token the cancel API requires")  # fmt: skip
    p.add_argument("--drain-timeout", type=float, default=env("drain_timeout", 30.0),
                   help="seconds calls may finish after SIGTERM")  # fmt: skip
    p.add_argument("--ready-file", type=Path, default=env("ready_file", None))
    p.add_argument("--max-body-bytes", type=int, default=env("max_body_bytes", 8 * 1024 * 1024))
    p.add_argument("--max-header-bytes", type=int, default=env("max_header_bytes", 8190))
    p.add_argument("--tombstone-ttl", type=float, default=env("tombstone_ttl", 60.0),
                   help="seconds a cancel for an unknown id waits for its request")  # fmt: skip
    p.add_argument("--log-level", default=env("log_level", "INFO"))
    sim = p.add_argument_group("simulated engine (--engine sim)")
    d = SimConfig()
    sim.add_argument("--sim-slots", type=int, default=env("sim_slots", d.slots))
    sim.add_argument(
        "--sim-max-model-len", type=int, default=env("sim_max_model_len", d.max_model_len)
    )
    sim.add_argument("--sim-step-base", type=float, default=env("sim_step_base", d.step_base_s))
    sim.add_argument(
        "--sim-step-per-seq", type=float, default=env("sim_step_per_seq", d.step_per_seq_s)
    )
    sim.add_argument("--sim-prefill-per-token", type=float,
                     default=env("sim_prefill_per_token", d.prefill_per_token_s))  # fmt: skip
    sim.add_argument(
        "--sim-prefill-chunk", type=int, default=env("sim_prefill_chunk", d.prefill_chunk_tokens)
    )
    sim.add_argument("--seed", type=int, default=env("seed", d.seed))
    add_vllm_arguments(p, env)
    return p


def from_args(
    argv: list[str] | None = None, environ: Mapping[str, str] | None = None
) -> GatewayConfig:
    """Parse flags and environment into a config. Raises ConfigError naming the bad option."""
    environ = os.environ if environ is None else environ
    ns = parser(environ).parse_args(argv)
    token = _read_token(ns.cancel_token_file)
    config = GatewayConfig(
        host=ns.host, http_port=ns.http_port, grpc_port=ns.grpc_port, engine=ns.engine,
        model=ns.model, served_model_name=ns.served_model_name, workers=ns.workers,
        cancel_token=token, drain_timeout=ns.drain_timeout, ready_file=ns.ready_file,
        max_body_bytes=ns.max_body_bytes, max_header_bytes=ns.max_header_bytes,
        tombstone_ttl=ns.tombstone_ttl, log_level=ns.log_level.upper(),
        sim=SimConfig(
            slots=ns.sim_slots, max_model_len=ns.sim_max_model_len, step_base_s=ns.sim_step_base,
            step_per_seq_s=ns.sim_step_per_seq, prefill_per_token_s=ns.sim_prefill_per_token,
            prefill_chunk_tokens=ns.sim_prefill_chunk, seed=ns.seed,
        ),
        vllm=VllmOptions.from_namespace(ns),
    )  # fmt: skip
    validate(config)
    return config


def validate(config: GatewayConfig) -> None:
    if config.engine == "vllm" and not config.model:
        raise ConfigError("--engine vllm needs --model (a local path or a model name)")
    if config.workers < 1:
        raise ConfigError("--workers must be at least 1")
    for name in ("http_port", "grpc_port"):
        port = getattr(config, name)
        if not 0 <= port <= 65535:
            raise ConfigError(f"--{name.replace('_', '-')} must be between 0 and 65535")
    if config.drain_timeout < 0:
        raise ConfigError("--drain-timeout must not be negative")
    if config.max_body_bytes < 1024:
        raise ConfigError("--max-body-bytes must be at least 1024")
    if config.sim.slots < 1 or config.sim.prefill_chunk_tokens < 1:
        raise ConfigError("--sim-slots and --sim-prefill-chunk must be at least 1")


def _read_token(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"--cancel-token-file {path}: {exc.strerror}") from exc
    if not token:
        raise ConfigError(f"--cancel-token-file {path} is empty")
    return token
