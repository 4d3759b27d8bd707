"""Truss's own model server (truss 0.18.36, no Docker) on 127.0.0.1, serving the project's own
Truss models (``bench/harness/truss/models``), for the Truss tier.

``make test`` installs truss and the server's own requirements (the package's
``templates/server/requirements.txt`` without its index line, under its ``constraints.txt``) into
a virtualenv of their own, ``.venv-truss``. A model's server directory is laid out as its image
would hold it: ``TrussHandle(model).docker_build_setup(build)`` writes the image's build context,
and the Dockerfile's ``COPY`` lines are done here (``server/`` is ``/app``, ``model/`` is
``/app/model``, ``config.yaml`` is ``/app/config.yaml``). Truss binds ``0.0.0.0``, hard-coded:
``bench/harness/truss/launch_loopback.py`` hands its uvicorn a socket bound to 127.0.0.1 instead.
Each model appends what it saw to ``<records>/<model>.jsonl``
(``bench/harness/truss/models/record.py``)."""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.base.processes import REPO, stop_group, wait_ready
from bench.base.waiting import poll_until
from bench.harness.model_servers import ModelServer, read_records

VENV = REPO / ".venv-truss"
PYTHON = VENV / "bin" / "python"
MODELS = Path(__file__).parent / "models"
LAUNCHER = Path(__file__).parent / "launch_loopback.py"
READY_S = 60.0
_LAYOUT = (
    "import sys; from pathlib import Path; "
    "from truss.truss_handle.truss_handle import TrussHandle; "
    "TrussHandle(Path(sys.argv[1])).docker_build_setup(Path(sys.argv[2]))"
)


@dataclass
class TrussServer(ModelServer):
    model: str

    def ended(self) -> dict[Any, dict[str, Any]]:
        """What the model saw of each request, by id: the latest line (``started`` while it runs,
        then ``finished``, ``disconnected`` or ``closed``, with ``step`` and ``at``)."""
        return read_records(self.records / f"{self.model}.jsonl", "id")

    def seen(self, request_id: str) -> list[dict[str, Any]]:
        """Every line the model wrote for ``request_id``, in order."""
        path = self.records / f"{self.model}.jsonl"
        text = path.read_text() if path.exists() else ""
        lines = [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line]
        return [line for line in lines if line["id"] == request_id]


def skip_reason() -> str | None:
    """Why Truss cannot run here (the tier then skips), or None."""
    if not (VENV / ".installed").exists():
        return f"no {VENV.name}: `make test` installs truss 0.18.36 and its server there"
    return None


def lay_out(model: str, work: Path) -> Path:
    """The server directory (the image's ``/app``) for ``bench/harness/truss/models/<model>``."""
    source = work / "source"
    shutil.copytree(MODELS / model, source, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(MODELS / "record.py", source / "model" / "record.py")
    build = work / "build"
    subprocess.run([str(PYTHON), "-c", _LAYOUT, str(source), str(build)], check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    app = work / "app"
    shutil.copytree(build / "server", app)
    shutil.copytree(build / "model", app / "model")
    shutil.copy(build / "config.yaml", app / "config.yaml")
    return app


def _loaded(server: TrussServer) -> str | None:
    if server.popen.poll() is not None:
        return "exited"
    with (
        contextlib.suppress(OSError),
        urllib.request.urlopen(f"{server.url()}/v1/models/model", timeout=1) as answer,
    ):
        return "loaded" if answer.status == 200 else None
    return None


@contextlib.contextmanager
def running_truss(models: list[str], work: Path) -> Iterator[dict[str, TrussServer]]:
    """A Truss server for each of ``models``, started together, by model name."""
    records = work / "records"
    records.mkdir(parents=True)
    servers: dict[str, TrussServer] = {}
    try:
        for model in models:
            app = lay_out(model, work / model)
            log_path = work / f"{model}.log"
            ready = work / f"{model}.ready.json"
            with log_path.open("wb") as out:
                popen = subprocess.Popen(
                    [str(PYTHON), str(LAUNCHER), str(ready)], cwd=app, stdout=out,
                    stderr=subprocess.STDOUT, env={"PATH": f"{VENV / 'bin'}:/usr/bin:/bin",
                    "TRUSS_RECORD_DIR": str(records), "PYTHONUNBUFFERED": "1"},
                    process_group=0,  # its own group (not session): ended with it
                )  # fmt: skip
            servers[model] = TrussServer(popen, "", records, log_path, model=model)
            servers[model].http = wait_ready(popen, ready, log_path, READY_S)["http"]
        for server in servers.values():
            state = poll_until(functools.partial(_loaded, server), READY_S,
                               f"Truss {server.model}", 0.05, explain=server.log)  # fmt: skip
            assert state == "loaded", server.log()
        yield servers
    finally:
        for server in servers.values():
            stop_group(server.popen)
