"""The chart's pod shut down as the kubelet shuts it down (tests/support/kube_pod.py,
``Pod.terminate``: podman runs no preStop hook), with the chart's shutdown values for a local run:
a stream shorter than the proxy's drain finishes, one that outlives it is cancelled at the gateway
(reason ``shutdown``: the gateway's preStop keeps it serving until the proxy's cancels have
landed), and both containers exit cleanly inside the grace period. Its own pod: it ends it.
"""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any

import pytest

from tests.deploy.test_chart_pod import LOCAL_VALUES, open_stream, read_to_end, wait_ready
from tests.support.chart import HelmEngine
from tests.support.containers import Engine
from tests.support.kube_pod import played_pod

pytestmark = pytest.mark.slow


def gateway_calls(log: str) -> dict[str, dict[str, Any]]:
    """The gateway's per-call log lines, by call id."""
    calls = {}
    for line in log.splitlines():
        if line.startswith("{") and '"call_id"' in line:
            record = json.loads(line)
            calls[record["call_id"]] = record
    return calls


def test_shutdown_finishes_what_fits_the_drain_and_cancels_the_rest(
    engine: Engine, cpu_image: Any, helm: HelmEngine
) -> None:
    if engine.podman is None:
        pytest.skip(f"the chart's pod is played by podman's kube play; {engine.name} has none")
    release = helm.render(LOCAL_VALUES)
    assert release.ok, release.error
    with played_pod(engine.podman, release.objects()) as pod:
        wait_ready(pod)
        grace = pod.spec["terminationGracePeriodSeconds"]
        proxy_args = pod.container("proxy")["args"]
        assert "--drain-timeout=3" in proxy_args, proxy_args
        long_stream, long_id = open_stream(pod, max_tokens=4000)  # 40 s of tokens
        short_stream, short_id = open_stream(pod, max_tokens=150)  # under 2 s
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            stopping = pool.submit(pod.terminate)
            try:
                for sock in (long_stream, short_stream):
                    sock.settimeout(grace + 5)
                short_rest = read_to_end(short_stream)
                long_rest = read_to_end(long_stream)
            finally:
                long_stream.close()
                short_stream.close()
            stopping.result(timeout=grace + 60)
        assert short_rest.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), short_rest[-300:]
        assert b"[DONE]" not in long_rest, long_rest[-300:]
        calls = gateway_calls(pod.logs("gateway"))
        assert calls[short_id]["outcome"] == "completed", calls.get(short_id)
        assert calls[long_id]["outcome"] == "cancelled", calls.get(long_id)
        assert calls[long_id]["reason"] == "shutdown", calls[long_id]
        for container in ("gateway", "proxy"):
            assert pod.exit_code(container) == 0, (container, pod.logs(container)[-2000:])
            assert pod.terminated[container] < grace, (container, pod.terminated, grace)
        # The proxy is done inside the gateway's preStop (the chart sizes it as the proxy's
        # preStop, drain and cancel deadline), so its shutdown cancels find the gateway serving.
        gateway_pre_stop = float(
            pod.container("gateway")["lifecycle"]["preStop"]["exec"]["command"][1]
        )
        assert pod.terminated["proxy"] < gateway_pre_stop, (pod.terminated, gateway_pre_stop)
        assert pod.terminated["gateway"] > pod.terminated["proxy"], pod.terminated
