"""``/metrics`` and ``/metrics/pool`` for the whole gateway, answered by any API process.

Counters and histograms come from prometheus_client's multiprocess files in the run directory
(they keep what a process that died had counted), read so that a file not readable yet (a
process starting) is skipped for that scrape and counted in
``hangup_gateway_metrics_files_skipped_total`` (:mod:`hangup_contract.runtime.process_files`).
The in-flight and engine-load gauges are read live from every process over the channel at each
scrape and summed by series (worker labels are gateway-wide indices, so they do not collide);
the model-server protocol's gauges (:mod:`gateway_server.metrics.pool`) combine every process's
worker loads into one series each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import astuple
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway_server.metrics.gateway import WorkerLoad
from gateway_server.metrics.pool import PoolProtocolCollector
from gateway_server.siblings.ops import Op
from gateway_server.siblings.processes import ApiProcess
from hangup_contract.runtime.process_files import ProcessFiles
from hangup_contract.runtime.sibling_lines import Message
from hangup_contract.runtime.siblings import Channel


class SiblingMetrics:
    """The gateway's expositions from this process: its own live gauges (``live``, read at
    every scrape, here and for siblings) and worker loads, and every sibling's."""

    def __init__(
        self,
        me: ApiProcess,
        channel: Channel,
        live: Iterable[Collector],
        worker_loads: Callable[[], Iterable[WorkerLoad]],
        *,
        model: str,
    ) -> None:
        self._channel = channel
        self._worker_loads = worker_loads
        self._pod_loads: list[WorkerLoad] = []  # every process's, read at this scrape
        self._live = CollectorRegistry(auto_describe=False)
        for collector in live:
            self._live.register(collector)
        self._gathered = _Gathered()
        self._exposed = CollectorRegistry(auto_describe=False)
        # In the multiprocess files (every process's summed), as every counter here.
        skipped = Counter(
            "hangup_gateway_metrics_files_skipped",
            "Sibling processes' metrics files a scrape could not read yet and skipped.",
            registry=CollectorRegistry(),
        )
        files = ProcessFiles(me.run_dir, lambda _: skipped.inc(), keep=_ours)
        self._exposed.register(files)
        self._exposed.register(self._gathered)
        pool = PoolProtocolCollector(model, lambda: self._pod_loads)
        self._exposed.register(pool)
        self._pool = CollectorRegistry(auto_describe=False)
        self._pool.register(pool)
        restarts = Counter(
            "hangup_gateway_api_process_restarts",
            "API processes that exited and were started again.",
            registry=CollectorRegistry(),
        )
        if me.restarted:
            restarts.inc()
        channel.on(Op.LOADS, lambda _: {"loads": self._own_loads()})
        channel.on(Op.GAUGES, lambda _: {"families": self._gauges(), "loads": self._own_loads()})

    async def exposition(self) -> bytes:
        """``/metrics`` for the whole gateway: every process's counters and histograms (the
        multiprocess files) and every live process's gauges, summed."""
        answers = list((await self._channel.ask_all(Op.GAUGES)).answered.values())
        self._gathered.families = [self._gauges(), *(a.get("families", []) for a in answers)]
        self._gathered.processes = 1 + len(answers)
        self._pod_loads = self._loads_with(answers)
        return generate_latest(self._exposed)

    async def pool_exposition(self) -> bytes:
        """``/metrics/pool``: the Endpoint Picker's gauges over every process's workers (their
        loads only, not every gauge: an EPP asks every 50 ms)."""
        answers = await self._channel.ask_all(Op.LOADS)
        self._pod_loads = self._loads_with(list(answers.answered.values()))
        return generate_latest(self._pool)

    def _loads_with(self, answers: list[Message]) -> list[WorkerLoad]:
        """This process's worker loads and those the siblings' ``answers`` carry."""
        theirs = [WorkerLoad(*fields) for a in answers for fields in a.get("loads", ())]
        return [*self._worker_loads(), *theirs]

    def _own_loads(self) -> list[tuple[Any, ...]]:
        return [astuple(load) for load in self._worker_loads()]

    def _gauges(self) -> list[Any]:
        """This process's live gauges as ``[name, help, [[sample, labels, value], ...]]``."""
        return [
            [f.name, f.documentation, [[x.name, x.labels, x.value] for x in f.samples]]
            for f in self._live.collect()
        ]


def _ours(family: str) -> bool:
    """The gateway's own families of the multiprocess files. vLLM writes its metrics there too
    (it sees ``PROMETHEUS_MULTIPROC_DIR``), each process's engine as ``engine="0"``; the
    one-process gateway does not export them either."""
    return family.startswith("hangup_")


class _Gathered(Collector):
    """The gauges read from every process at this scrape, summed by series."""

    def __init__(self) -> None:
        self.families: list[list[Any]] = []
        self.processes = 1

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = {}
        for families in self.families:
            for name, documentation, samples in families:
                series = merged.setdefault(name, (documentation, {}))[1]
                for sample, labels, value in samples:
                    key = (sample, tuple(sorted(labels.items())))
                    series[key] = series.get(key, 0.0) + value
        for name, (documentation, series) in merged.items():
            family = Metric(name, documentation, "gauge")
            for (sample, labels), value in series.items():
                family.add_sample(sample, dict(labels), value)
            yield family
        yield GaugeMetricFamily(
            "hangup_gateway_api_processes",
            "API processes serving (answering their siblings at this scrape).",
            value=self.processes,
        )
