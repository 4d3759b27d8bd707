"""How each request ended, as a Truss model of the Truss tier saw it: one JSON line per event,
appended to ``$TRUSS_RECORD_DIR/<model>.jsonl`` (the launcher sets it). Copied next to each
``model.py`` when the server's directory is laid out (``bench/harness/truss/server.py``).

It also counts the calls a model runs, ``truss_model_calls_running``, a gauge on
prometheus_client's default registry, which Truss's server exports on its /metrics: a metric of a
model's own, what the chart's `helm test` reads in front of Truss (test.serverInflight)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from prometheus_client import Gauge

RUNNING = Gauge("truss_model_calls_running", "Calls the model is running.")


class Record:
    """One request's record: ``started`` when the model begins it, then how it ended (``finished``,
    ``disconnected`` when the model saw its client gone, ``closed`` when its generator was closed
    by the server) and after how many steps."""

    def __init__(self, model: str, request_id: str, steps: int) -> None:
        self.model = model
        self.id = request_id
        self.steps = steps
        self.how: str | None = None
        RUNNING.inc()
        self.write(how="started", step=0)

    def end(self, how: str, step: int) -> None:
        if self.how is None:
            self.how = how
            RUNNING.dec()
            self.write(how=how, step=step)

    def write(self, **fields: Any) -> None:
        line = json.dumps({"id": self.id, "at": time.time(), **fields}) + "\n"
        path = os.path.join(os.environ["TRUSS_RECORD_DIR"], f"{self.model}.jsonl")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write with O_APPEND: lines never interleave
        finally:
            os.close(fd)


class NothingToLoad:
    """What Truss asks of a model class besides ``predict``: it is built with the server's keyword
    arguments (``config``, ``data_dir``, ``secrets``...), then ``load`` is called; these models
    need neither."""

    def __init__(self, **kwargs: Any) -> None:
        pass

    def load(self) -> None:
        pass


def request_of(inputs: Any, default_steps: int) -> tuple[str, int]:
    """The id and the number of steps a predict call asked for (``{"id": ..., "steps": ...}``)."""
    return str(inputs["id"]), int(inputs.get("steps", default_steps))
