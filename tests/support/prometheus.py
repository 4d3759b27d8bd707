"""A real Prometheus server on loopback for tests: scrape targets given as host:port, rule files,
1 s scrape and evaluation intervals, its data in a temporary directory.

Prometheus cannot be told to pick its own port and report it, so a free loopback port is found by
binding port 0 first; a lost race shows up as Prometheus exiting, and it is retried.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.base.addresses import free_port


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


@dataclass(frozen=True)
class Target:
    job: str
    address: str  # host:port
    labels: dict[str, str]


@dataclass
class Prometheus:
    url: str
    popen: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector (or scalar, as a one-element list)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def finite(self, expr: str) -> list[dict[str, Any]]:
        """The series of ``expr`` whose value is a number (not NaN, not infinite)."""
        return [s for s in self.query(expr) if math.isfinite(float(s["value"][1]))]

    def label_values(self, label: str, match: str) -> list[str]:
        return list(self.api(f"label/{label}/values", **{"match[]": match}))

    def targets_up(self) -> dict[str, float]:
        return {s["metric"]["job"]: float(s["value"][1]) for s in self.query("up")}


def write_config(tmp: Path, targets: list[Target], rule_files: list[Path]) -> Path:
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": t.job, "static_configs": [{"targets": [t.address], "labels": t.labels}]}
            for t in targets
        ],
    }
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def running_prometheus(
    tmp: Path, targets: list[Target], rule_files: list[Path], timeout: float = 60.0
) -> Iterator[Prometheus]:
    binary = prometheus_binary()
    assert binary is not None
    tmp.mkdir(parents=True, exist_ok=True)
    config = write_config(tmp, targets, rule_files)
    for _attempt in range(3):
        port = free_port()
        log = tmp / "prometheus.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        server = Prometheus(f"http://127.0.0.1:{port}", popen, log)
        try:
            if wait_ready(server, timeout):
                yield server
                return
        finally:
            if popen.poll() is None:
                popen.terminate()
                try:
                    popen.wait(30)
                except subprocess.TimeoutExpired:
                    popen.kill()
                    popen.wait()
    raise RuntimeError(f"Prometheus did not start:\n{log.read_text()}")


def wait_ready(server: Prometheus, timeout: float) -> bool:
    """True once /-/ready answers 200; False if the process exits first (port taken)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.popen.poll() is not None:
            return False
        with (
            contextlib.suppress(urllib.error.URLError, ConnectionError),
            urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as resp,
        ):
            if resp.status == 200:
                return True
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.popen.wait(0.05)  # a pause that also notices an early exit
    raise TimeoutError(f"Prometheus not ready within {timeout}s:\n{server.log.read_text()}")


def wait_all_return_data(prometheus: Prometheus, exprs: dict[str, str], within: float = 60) -> None:
    """Wait, with a deadline, until each expression (by name) returns a finite value; the
    failure names the rest."""
    from bench.base.waiting import poll_until

    empty = dict(exprs)

    def all_have_data() -> bool:
        for name in [n for n, e in empty.items() if prometheus.finite(e)]:
            del empty[name]
        return not empty

    poll_until(
        all_have_data, within, "every expression to return data",
        interval=0.2, explain=lambda: f"no data for: {sorted(empty)}",
    )  # fmt: skip


def row_exprs(rows: tuple[int, ...]) -> dict[str, str]:
    """The dashboard's queries of ``rows``, variables expanded as Grafana's "All" does."""
    from tests.support.observability_files import panel_queries

    return {f"{q.panel} [{q.legend}]": q.promql() for q in panel_queries(rows=rows)}
