"""A real Triton Inference Server on 127.0.0.1, serving the project's own python-backend models
(``bench/harness/triton/models``), for the Triton tier.

Triton 2.51.0 comes from the ``nvidia-pytriton`` 0.7.0 wheel, which ships the ``tritonserver``
binary with the python backend only; ``make test`` installs it into a virtualenv of its own,
``.venv-triton`` (numpy 1.26 there: with numpy 2.3 the backend's stub crashed reading the first
BYTES input). The binary is run directly on a model repository of our own, not through PyTriton's
``bind()``, whose functions never see a cancellation. What it needs, each found here:

- the python backend's stub links ``libpython3.11``: the virtualenv interpreter's ``LIBDIR``
  first in ``LD_LIBRARY_PATH`` (another 3.11 library on the machine would shadow it), then the
  wheel's ``nvidia_pytriton.libs``;
- the stub finds numpy through ``PATH``: the virtualenv's ``bin`` first;
- a backend directory holding the wheel's python backend and its 3.11 stub.

Triton takes no port 0, so three free ports are picked and a start that lost one of them to
another process is made again on new ones (at most three times). Each model appends how every
request ended to ``<records>/<model>.jsonl`` (``bench/harness/triton/models/record.py``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.base.addresses import free_ports
from bench.base.processes import REPO, stop_group
from bench.base.waiting import poll_until
from bench.harness.model_servers import ModelServer, read_records

VENV = REPO / ".venv-triton"
MODELS = Path(__file__).parent / "models"
READY_S = 60.0
BIND_ATTEMPTS = 3


@dataclass(frozen=True)
class Install:
    server: Path  # the tritonserver binary
    backends: Path  # the wheel's backends/ (python)
    stub: Path  # the python backend's stub for 3.11
    env: dict[str, str]  # PATH and LD_LIBRARY_PATH as the stub needs them


@dataclass
class TritonServer(ModelServer):
    grpc: str  # host:port
    metrics: str

    def ended(self, model: str, by: str = "id") -> dict[Any, dict[str, Any]]:
        """How each request of ``model`` ended, by request id (or by ``prompt``, for an HTTP
        ``generate`` call, which carries no id; the slow model: its input's ``first`` value):
        the latest line per key (``how`` is ``started`` while the slow model runs it)."""
        return read_records(self.records / f"{model}.jsonl", by)


def install() -> Install | str:
    """What is needed to run Triton here, or why it cannot run (the tier then skips)."""
    python = VENV / "bin" / "python"
    if not python.exists():
        return f"no {VENV.name}: `make test` installs nvidia-pytriton there (x86_64 Linux only)"
    found = subprocess.run(
        [str(python), "-c", "import sysconfig, site, sys; "
         "print(sysconfig.get_config_var('LIBDIR')); print(site.getsitepackages()[0]); "
         "print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if found.returncode != 0:
        return f"{python} does not run: {found.stderr.strip()}"
    libdir, site_packages, version = found.stdout.split()
    wheel = Path(site_packages) / "pytriton" / "tritonserver"
    server = wheel / "bin" / "tritonserver"
    stub = wheel / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not server.exists() or not stub.exists():
        return f"nvidia-pytriton in {VENV.name} has no tritonserver or no stub for {version}"
    libraries = [libdir, str(Path(site_packages) / "nvidia_pytriton.libs")]
    env = {
        "PATH": os.pathsep.join([str(VENV / "bin"), os.environ.get("PATH", "")]),
        "LD_LIBRARY_PATH": os.pathsep.join(libraries),
    }
    return Install(server, wheel / "backends", stub, env)


def _repository(tmp: Path, records: Path, models: Path, fill: dict[str, str]) -> Path:
    """The models, copied, with where to record (and ``fill``: ``@NAME@`` -> value) filled in
    and ``record.py`` beside each."""
    repository = tmp / "models"
    fill = {"RECORD_DIR": str(records), **fill}
    for model in (p for p in models.iterdir() if (p / "config.pbtxt").exists()):
        copy = repository / model.name
        shutil.copytree(model, copy, ignore=shutil.ignore_patterns("__pycache__"))
        config = copy / "config.pbtxt"
        text = config.read_text()
        for name, value in fill.items():  # a protobuf text string: quotes and \\ escaped
            text = text.replace(f"@{name}@", value.replace("\\", "\\\\").replace('"', '\\"'))
        config.write_text(text)
        for version in (p for p in copy.iterdir() if p.is_dir()):
            shutil.copy(MODELS / "record.py", version / "record.py")
    return repository


def _backends(tmp: Path, found: Install) -> Path:
    backends = tmp / "backends"
    shutil.copytree(found.backends, backends)
    shutil.copy(found.stub, backends / "python" / found.stub.name)
    return backends


def _ready(server: TritonServer, ready_s: float) -> bool:
    """True once Triton answers ready; False if it exited first (the caller reads its log)."""

    def answered() -> str | None:
        if server.popen.poll() is not None:
            return "exited"
        ready = f"{server.url()}/v2/health/ready"
        with contextlib.suppress(OSError), urllib.request.urlopen(ready, timeout=1) as answer:
            return "ready" if answer.status == 200 else None
        return None

    state = poll_until(answered, ready_s, "Triton to be ready", 0.05, explain=server.log)
    return state == "ready"


def _stop(popen: subprocess.Popen[bytes]) -> None:
    """Triton, then its whole group (the backend stubs, vLLM's engine core) once it has exited."""
    stop_group(popen, wait_s=15)


@contextlib.contextmanager
def running_triton(
    tmp: Path,
    found: Install,
    models: Path = MODELS,
    fill: dict[str, str] | None = None,
    ready_s: float = READY_S,
    env: dict[str, str] | None = None,
    args: Sequence[str] = (),
) -> Iterator[TritonServer]:
    """Triton serving the models of ``models`` (``fill`` fills in their configurations; ``env``
    added to its environment; ``args`` added to its command line)."""
    records = tmp / "records"
    records.mkdir(parents=True)
    repository = _repository(tmp, records, models, fill or {})
    backends = _backends(tmp, found)
    environment = {**os.environ, **found.env, **(env or {})}
    for attempt in range(BIND_ATTEMPTS):
        http, grpc, metrics = free_ports(3)
        log_path = tmp / f"triton-{attempt}.log"
        with log_path.open("wb") as out:
            popen = subprocess.Popen(
                [str(found.server), "--model-repository", str(repository),
                 "--backend-directory", str(backends), "--allow-gpu-metrics=false",
                 "--http-address", "127.0.0.1", "--http-port", str(http),
                 "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc),
                 "--metrics-address", "127.0.0.1", "--metrics-port", str(metrics),
                 "--exit-timeout-secs", "5", *args],
                stdout=out, stderr=subprocess.STDOUT, env=environment,
                process_group=0,  # its own group (not session): the stubs end with it
            )  # fmt: skip
        server = TritonServer(popen, f"127.0.0.1:{http}", records, log_path,
                              grpc=f"127.0.0.1:{grpc}", metrics=f"127.0.0.1:{metrics}")  # fmt: skip
        try:
            if _ready(server, ready_s):
                break
        except BaseException:
            _stop(popen)
            raise
        _stop(popen)
        if "already in use" not in server.log() and "Address in use" not in server.log():
            raise RuntimeError(f"Triton exited with {popen.returncode}:\n{server.log()}")
    else:
        raise RuntimeError(f"Triton lost its ports {BIND_ATTEMPTS} times:\n{server.log()}")
    try:
        yield server
    finally:
        _stop(server.popen)
