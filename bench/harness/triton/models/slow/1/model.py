"""Triton python-backend model: the slow one (see config.pbtxt). ``steps`` (a request
parameter, default 20) steps of 50 ms, checking ``is_cancelled()`` every step; a cancelled
request is answered with Triton's CANCELLED error. When each request started running, and how it
ended, is recorded (``record.py``)."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(__file__))
from record import record, record_dir  # beside this file, once copied

STEP_S = 0.05


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.records = record_dir(args)

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._run(request) for request in requests]

    def _run(self, request: Any) -> Any:
        steps = int(json.loads(request.parameters() or "{}").get("steps", 20))
        values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
        # by id, or by its first value for a call that carries no id (HTTP generate)
        key = {"id": request.request_id(), "first": float(values.flat[0]) if values.size else 0}
        record(self.records, "slow", **key, how="started", steps=0)
        for step in range(steps):
            if request.is_cancelled():
                record(self.records, "slow", **key, how="cancelled", steps=step)
                error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                return pb_utils.InferenceResponse(error=error)
            time.sleep(STEP_S)
        record(self.records, "slow", **key, how="finished", steps=steps)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", values * 2)])
