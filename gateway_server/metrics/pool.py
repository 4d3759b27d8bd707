"""The model-server metrics protocol: what an Endpoint Picker reads to choose this pod.

Behind the Kubernetes inference routing stack (Gateway API Inference Extension, llm-d), an
Endpoint Picker (EPP) chooses a pod of an InferencePool per request from each pod's load. It
scrapes ``GET /metrics`` on the pool's target port (the proxy's HTTP port, which relays it
here), by default every 50 ms, and reads gauges named as vLLM exports them, labels
``model_name`` and ``engine`` (names, types and labels as vLLM 0.32's exporter has them):

===============================  ===============================================================
``vllm:num_requests_waiting``    requests queued: accepted, not yet in the engine's batch
``vllm:num_requests_running``    requests in the engine's batch
``vllm:kv_cache_usage_perc``     KV-cache use as a fraction, 1 = full
``vllm:cache_config_info``       1; labels ``block_size`` and ``num_gpu_blocks``
===============================  ===============================================================

The EPP reads one series per name (of several, it keeps the last), so a pod must read as one
endpoint: every name has one series, combined over every worker of every API process:
requests summed, KV-cache use as the pod's used blocks over its blocks (its workers' caches as
one), ``num_gpu_blocks`` summed, ``engine="0"`` as a vLLM server with one engine labels it.
The values are the per-worker load the gateway reads at every scrape anyway
(``hangup_gateway_engine_*``): vLLM's scheduler statistics for ``vllm``, the simulation's
queue and held tokens for ``sim``. vLLM's own exporter is not used: it runs per engine, and
the gateway exports none of vLLM's families (see ``gateway_server.siblings.metrics``).

``vllm:lora_requests_info`` is not exported: the gateway serves no LoRA adapters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway_server.metrics.gateway import WorkerLoad

ENGINE = "0"
"""The ``engine`` label of every series: the pod reads as one engine."""


class PoolProtocolCollector(Collector):
    """The protocol's gauges for ``model``, over the loads ``read`` returns at each scrape."""

    def __init__(self, model: str, read: Callable[[], Iterable[WorkerLoad]]) -> None:
        self._model = model
        self._read = read

    def collect(self) -> Iterator[Metric]:
        return iter(protocol_families(self._model, list(self._read())))


def protocol_families(model: str, loads: list[WorkerLoad]) -> list[Metric]:
    up = [load for load in loads if load.up]
    blocks = sum(load.kv_blocks for load in up)
    used = sum(load.kv * load.kv_blocks for load in up)
    labels = {"model_name": model, "engine": ENGINE}

    def gauge(name: str, documentation: str, value: float) -> Metric:
        family = GaugeMetricFamily(name, documentation, labels=list(labels))
        family.add_metric(list(labels.values()), value)
        return family

    families = [
        gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            sum(load.running for load in up),
        ),
        gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            sum(load.waiting for load in up),
        ),
        gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            used / blocks if blocks else 0.0,
        ),
    ]
    block_size = next((load.block_size for load in up if load.block_size), 0)
    if blocks and block_size:  # known once an engine has started
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "engine", "num_gpu_blocks"],
        )
        info.add_metric([str(block_size), ENGINE, str(blocks)], 1.0)
        families.append(info)
    return families
