"""One log line shape in the pod: the gateway and the proxy, run as processes, write the same
JSON record fields in the same order."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.support.processes import spawn


def test_both_processes_write_one_log_line_shape(tmp_path: Path) -> None:
    """Operators' log pipelines read the gateway and the proxy of a pod the same way."""
    with spawn("gateway_server", ["--http-port", "0", "--grpc-port", "0"], tmp_path / "g") as gw:
        args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                "--upstream-http", gw.url()]  # fmt: skip
        with spawn("proxy", args, tmp_path / "p") as px:
            assert px.terminate() == 0
        assert gw.terminate() == 0
        logs = {"gateway": gw.log(), "proxy": px.log()}
    for process, text in logs.items():
        records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        assert records, process
        for record in records:
            assert list(record)[:4] == ["ts", "level", "logger", "msg"], (process, record)
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["ts"]), record
            assert record["logger"].startswith(f"hangup.{process}"), record
        assert any(r["msg"] in {"serving", "listening"} for r in records), (process, records)
