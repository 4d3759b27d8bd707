"""A second image for the pod tests, of a server that is not hangup's: Truss's own model server
(truss 0.18.36) serving a model of the Truss tier's (``bench/harness/truss/models``), built as
`truss image build` writes its Dockerfile (the server's requirements under its constraints, the
server at /app, the model at /app/model, ``python3 /app/main.py``), from the base `make
container-host` puts in podman's store and PyPI: Truss's own base image is on a registry no test
reaches.

Two changes for a pod the chart runs: an empty /app/data (Truss makes it at start, which a
read-only root refuses), and uid 10001 (the chart's pod runs as it; Truss's image runs as root).
The server's directory is laid out by ``.venv-truss``'s truss (``bench/harness/truss/server.py``).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench.harness.truss import server as truss_server
from bench.harness.unavailable import Unavailable
from tests.support.containers import BASE, Engine

TRUSS_IMAGE = "localhost/hangup-truss:test"
MODEL = "polling_stream"
"""A generator that yields a line every 20 ms and asks ``is_disconnected()`` before each."""

DOCKERFILE = f"""\
FROM {BASE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements.txt constraints.txt /build/
RUN python -m venv /opt/truss \\
    && /opt/truss/bin/pip install -r /build/requirements.txt -c /build/constraints.txt
ENV PATH=/opt/truss/bin:$PATH PYTHONUNBUFFERED=1 INFERENCE_SERVER_PORT=8080
WORKDIR /app
COPY server /app
COPY model /app/model
COPY config.yaml /app/config.yaml
RUN mkdir -p /app/data
USER 10001:10001
ENTRYPOINT ["python3", "/app/main.py"]
"""


def build_truss_image(engine: Engine, tag: str = TRUSS_IMAGE, model: str = MODEL) -> Any:
    """The Truss image of ``model``, built with ``engine`` (its pip reaches PyPI on the host's
    network); raises Unavailable where ``.venv-truss`` is missing."""
    if reason := truss_server.skip_reason():
        raise Unavailable(reason)
    with tempfile.TemporaryDirectory(prefix="hangup-truss-image-") as tmp:
        work = Path(tmp)
        truss_server.lay_out(model, work / "layout")
        build = work / "layout" / "build"  # what `truss image build` would build from
        context = work / "context"
        shutil.copytree(build / "server", context / "server")
        shutil.copytree(build / "model", context / "model")
        shutil.copy(build / "config.yaml", context / "config.yaml")
        shutil.copy(build / "constraints.txt", context / "constraints.txt")
        requirements = (build / "requirements.txt").read_text().splitlines()
        (context / "requirements.txt").write_text(
            "\n".join(line for line in requirements if not line.startswith("-i")) + "\n"
        )
        (context / "Dockerfile").write_text(DOCKERFILE)
        image, _ = engine.client.images.build(
            path=str(context), tag=tag, rm=True, network_mode="host"
        )
    return image
