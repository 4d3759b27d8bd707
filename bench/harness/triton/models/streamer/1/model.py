"""Triton python-backend model: the streamer (see config.pbtxt). Each request runs in a thread
of its own (decoupled), one step every ``step_s`` seconds: first ``prefill_s`` seconds of silence
(as a long prefill), then one token a step up to ``max_tokens``, all three read from
``sampling_parameters``. Every step checks ``is_cancelled()``; how the request ended is recorded
(``record.py``). The requests running are a gauge on Triton's metrics port
(``streamer_requests_running``, a custom metric): what `helm test` reads of a model of its own."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(__file__))
from record import record, record_dir  # beside this file, once copied

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _input(request: Any, name: str) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().flatten()[0]


def _text(text: str) -> Any:
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))]
    )


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.records = record_dir(args)
        family = pb_utils.MetricFamily(
            name="streamer_requests_running",
            description="Requests the streamer is running (started, not yet ended).",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self._family = family  # a family dropped by Python is dropped by Triton
        self._gauge = family.Metric(labels={"model": "streamer"})
        self._lock = threading.Lock()
        self._running = 0

    def _count(self, change: int) -> None:
        with self._lock:
            self._running += change
            self._gauge.set(self._running)

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            self._count(1)
            threading.Thread(target=self._counted, args=(request,), daemon=True).start()

    def _counted(self, request: Any) -> None:
        try:
            self._run(request)
        finally:
            self._count(-1)

    def _run(self, request: Any) -> None:
        sender = request.get_response_sender()
        prompt = _input(request, "text_input").decode()
        stream = bool(_input(request, "stream") or False)
        exclude = bool(_input(request, "exclude_input_in_output") or False)
        raw = _input(request, "sampling_parameters")
        params = json.loads(raw) if raw else {}
        step_s = float(params.get("step_s", 0.05))
        silent = int(float(params.get("prefill_s", 0)) / step_s)
        tokens = int(params.get("max_tokens", 16))
        steps, made = 0, []
        for step in range(silent + tokens):
            if request.is_cancelled():
                sender.send(flags=FINAL)
                record(self.records, "streamer", id=request.request_id(), prompt=prompt,
                       how="cancelled", steps=steps, tokens=len(made))  # fmt: skip
                return
            time.sleep(step_s)
            steps += 1
            if step < silent:
                continue
            made.append(f" t{len(made)}")
            if stream:
                sender.send(_text(made[-1]), flags=FINAL if len(made) == tokens else 0)
        if not stream:
            sender.send(_text(("" if exclude else prompt) + "".join(made)), flags=FINAL)
        elif not made:
            sender.send(flags=FINAL)
        record(self.records, "streamer", id=request.request_id(), prompt=prompt, how="finished",
               steps=steps, tokens=len(made))  # fmt: skip
