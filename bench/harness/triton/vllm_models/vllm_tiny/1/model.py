"""Triton python-backend model: vLLM's ``AsyncLLM`` inside Triton, as Triton's vLLM backend runs
it (see config.pbtxt), written here for the Triton tier. Requests run as tasks on one event loop
in a thread of the model's; a watcher asks Triton every ``CHECK_S`` whether the request was
cancelled and, if so, cancels the task, which makes ``AsyncLLM.generate`` abort the request in
the engine (as vLLM's own server does when its client leaves). How each request ended is
recorded (``record.py``), and the engine's latest scheduler statistics are written to
``<record_dir>/vllm_engine.json`` (requests running and waiting, KV-cache use, as the engine core
reports them), so a test sees from outside that a cancelled request left the engine.

What running vLLM in Triton's stub needs, each found here: the stub's Python starts isolated (it
ignores ``LANG`` and ``PYTHONPATH``), so the C locale is UTF-8'd before torch is imported (torch
fails reading its files otherwise), and vLLM comes from the project's virtualenv, put first on
``sys.path`` and on ``PYTHONPATH`` for the processes vLLM starts with the stub's interpreter (the
model registry inspects a model's class in one when its cache has no entry yet: on a fresh
machine Triton failed to load the model without it); numpy is the stub's own (1.26, imported
before this file runs: with numpy 2.3 the stub crashed on the first BYTES input)."""

from __future__ import annotations

import asyncio
import json
import locale
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

locale.setlocale(locale.LC_CTYPE, "C.UTF-8")

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from record import record, record_dir  # noqa: E402 (beside this file, once copied)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
CHECK_S = 0.01
START_S = 300.0


def _input(request: Any, name: str) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().flatten()[0]


def _text(text: str) -> Any:
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))]
    )


class EngineStats:
    """The engine core's latest scheduler statistics, written to ``path`` by a thread of its own
    when they change. Never from the event loop: a rename over a file on ext4 can wait seconds
    for the disk (its replace-by-rename flush), and the loop that reads vLLM's outputs and
    checks for cancellations stalled with it (a hang-up seen 7 s late)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.latest: dict[str, Any] = {}
        self.changed = threading.Event()
        threading.Thread(target=self._write, daemon=True).start()

    def update(self, stats: dict[str, Any]) -> None:
        self.latest = stats
        self.changed.set()

    def _write(self) -> None:
        while self.changed.wait():
            self.changed.clear()
            partial = self.path.with_suffix(".part")
            partial.write_text(json.dumps(self.latest))
            partial.replace(self.path)  # whole or not at all, for a reader

    def logger(self) -> Any:
        """A vLLM stat-logger factory feeding :meth:`update`, once per engine step."""
        from vllm.v1.metrics import loggers

        stats = self

        class _Logger(loggers.StatLoggerBase):  # type: ignore[misc]
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                self.steps = 0

            def record(self, scheduler: Any, iteration: Any, *args: Any, **kw: Any) -> None:
                if scheduler is None:
                    return
                self.steps += 1
                stats.update({"running": scheduler.num_running_reqs,
                              "waiting": scheduler.num_waiting_reqs,
                              "kv_cache_usage": float(scheduler.kv_cache_usage),
                              "steps": self.steps, "at": time.time()})  # fmt: skip

            def log_engine_initialized(self) -> None:
                pass

        return _Logger


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.records = record_dir(args)
        parameters = json.loads(args["model_config"])["parameters"]
        site_packages = parameters["site_packages"]["string_value"]
        sys.path.insert(0, site_packages)
        inherited = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [site_packages, inherited]))
        from vllm import SamplingParams
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.async_llm import AsyncLLM

        self.sampling, self.delta = SamplingParams, RequestOutputKind.DELTA
        engine_args = AsyncEngineArgs(**json.loads(parameters["engine_args"]["string_value"]))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def start() -> Any:  # AsyncLLM starts its output handler on the running loop
            stats = EngineStats(self.records / "vllm_engine.json")
            return AsyncLLM.from_engine_args(engine_args, stat_loggers=[stats.logger()])

        self.llm = asyncio.run_coroutine_threadsafe(start(), self.loop).result(START_S)

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            asyncio.run_coroutine_threadsafe(self._watched(request), self.loop)

    async def _watched(self, request: Any) -> None:
        """Runs the request, cancelling it once Triton says its client cancelled it."""
        rid = request.request_id() or f"triton-{uuid.uuid4().hex}"
        prompt = _input(request, "text_input").decode()
        sender = request.get_response_sender()
        made: list[int] = []
        run = asyncio.create_task(self._generate(request, rid, prompt, sender, made))
        while not run.done():
            await asyncio.wait({run}, timeout=CHECK_S)
            if not run.done() and request.is_cancelled():
                seen = time.time()
                run.cancel()  # AsyncLLM.generate aborts the request in the engine
                await asyncio.gather(run, return_exceptions=True)
                sender.send(flags=FINAL)
                record(self.records, "vllm_tiny", id=rid, prompt=prompt, how="cancelled",
                       tokens=made[0] if made else 0, seen=seen, aborted=time.time(),
                       unfinished=self.llm.get_num_unfinished_requests())  # fmt: skip
                return
        error = run.exception()
        if error is not None:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error))),
                        flags=FINAL)  # fmt: skip
            record(self.records, "vllm_tiny", id=rid, prompt=prompt, how="failed",
                   error=repr(error))  # fmt: skip
            return
        record(self.records, "vllm_tiny", id=rid, prompt=prompt, how="finished",
               tokens=made[0] if made else 0)  # fmt: skip

    async def _generate(
        self, request: Any, rid: str, prompt: str, sender: Any, made: list[int]
    ) -> None:
        stream = bool(_input(request, "stream") or False)
        exclude = bool(_input(request, "exclude_input_in_output") or False)
        raw = _input(request, "sampling_parameters")
        params = self.sampling(**(json.loads(raw) if raw else {}), output_kind=self.delta)
        made.append(0)
        text, sent = [], False
        async for output in self.llm.generate(prompt, params, rid):
            completion = output.outputs[0]  # this step's tokens (DELTA)
            made[0] += len(completion.token_ids)
            if stream:
                sender.send(_text(completion.text), flags=FINAL if output.finished else 0)
                sent = output.finished
                continue
            text.append(completion.text)
            if output.finished:
                sender.send(_text(("" if exclude else prompt) + "".join(text)), flags=FINAL)
                sent = True
        if not sent:
            sender.send(flags=FINAL)

    def finalize(self) -> None:
        """Stops the engine and its engine-core process (Triton waits for it otherwise)."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.shutdown()
        if getattr(self, "loop", None) is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
