"""Triton python-backend model: the sequence sum (see config.pbtxt). The running sum of each
sequence is kept by its correlation id, reset by the START control input."""

from __future__ import annotations

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.sums: dict[Any, float] = {}

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._run(request) for request in requests]

    def _run(self, request: Any) -> Any:
        start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy().flatten()[0]
        value = float(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
        sequence = request.correlation_id()
        self.sums[sequence] = (0.0 if start else self.sums.get(sequence, 0.0)) + value
        total = np.array([self.sums[sequence]], dtype=np.float32)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", total)])
