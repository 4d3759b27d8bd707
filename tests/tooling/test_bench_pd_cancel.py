"""bench.pd.cancel's reading of AIPerf's export (what it cancelled is what the gateway must have
counted) and its choice of cancellation delays from a probe call's phases."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench.instruments.aiperf_export import find_export, read_run, request_ids, summarize
from bench.pd.report import choose_delays, owners, report
from bench.pd.stack import slowest
from gateway_server.engine.vllm.kv_handoff import handoff_key


def export(**extra: Any) -> dict[str, Any]:
    """An AIPerf 0.13 summary export as it writes one (the fields the benchmark reads)."""
    return {
        "schema_version": "1.1",
        "request_count": {"unit": "requests", "avg": 19.0},
        "error_request_count": {"unit": "requests", "avg": 22.0},
        "time_to_first_token": {"unit": "ms", "avg": 181.5, "p50": 170.25},
        "request_latency": {"unit": "ms", "avg": 912.0, "p50": 900.0, "max": 9325.0},
        "output_token_throughput": {"unit": "tokens/sec", "avg": 310.4},
        "request_throughput": {"unit": "requests/sec", "avg": 4.1},
        "error_summary": [
            {"error_details": {"code": 499, "type": "RequestCancellationError",
                               "message": "Request cancelled 0.000s after being sent"},
             "count": 20},
            {"error_details": {"code": 499, "type": "RequestCancellationError",
                               "message": "Request cancelled by external signal"},
             "count": 1},
            {"error_details": {"code": 502, "type": "HTTPError", "message": "Bad Gateway"},
             "count": 1},
        ],
        **extra,
    }  # fmt: skip


def test_every_499_is_a_cancellation_and_other_errors_are_kept_apart() -> None:
    run = summarize(export())
    assert (run.completed, run.cancelled, run.other_errors) == (19, 21, 1)
    assert run.other_error_types == ("HTTPError: 1",)
    assert (run.ttft_ms_avg, run.ttft_ms_p50, run.output_tokens_s) == (181.5, 170.25, 310.4)
    assert run.latency_ms_max == 9325.0


def test_a_run_with_every_request_cancelled_has_no_latency_figures() -> None:
    run = summarize(
        export(request_count=None, time_to_first_token=None, output_token_throughput=None)
    )
    assert run.completed == 0 and run.cancelled == 21
    assert math.isnan(run.ttft_ms_avg) and math.isnan(run.output_tokens_s)
    assert summarize({}).cancelled == 0


def test_the_export_is_found_in_the_folder_aiperf_nests_it_in(tmp_path: Path) -> None:
    nested = tmp_path / "tiny-openai-completions-concurrency4"
    nested.mkdir()
    (nested / "profile_export_aiperf.json").write_text(json.dumps(export()))
    assert find_export(tmp_path).parent == nested
    assert read_run(tmp_path).cancelled == 21


def test_no_export_is_an_error_naming_the_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        find_export(tmp_path)


def test_delays_land_in_the_probes_transfer_and_half_way_through_its_decode() -> None:
    probe = {"queued": 0.001, "prefill": 0.004, "transfer": 0.2, "first_token": 0.3, "end": 1.3}
    assert choose_delays(probe) == pytest.approx({"0": 0.0, "handoff": 0.25, "late": 0.8})


def test_a_transfer_no_poll_saw_puts_the_handoff_delay_at_the_first_token() -> None:
    probe = {"prefill": 0.004, "first_token": 0.3, "end": 1.3}
    assert choose_delays(probe)["handoff"] == pytest.approx(0.3)


def test_delays_given_on_the_command_line_win_and_bad_ones_are_refused() -> None:
    probe = {"first_token": 0.3, "end": 1.3}
    assert choose_delays(probe, "0.1,2") == {"0": 0.0, "handoff": 0.1, "late": 2.0}
    with pytest.raises(ValueError, match="--delays wants two numbers"):
        choose_delays(probe, "0.1")
    with pytest.raises(ValueError, match="no first token"):
        choose_delays({"prefill": 0.01})


def test_the_report_shows_aiperfs_cancelled_beside_the_gateways_by_phase() -> None:
    run = summarize(export())
    cancel = {
        "label": "0", "delay_s": 0.0, "aiperf": run.__dict__,
        "gateway_cancellations": {"queued": 5.0, "prefill": 16.0, "transfer": 0.0, "decode": 0.0},
        "proxy_cancel_calls": {"ok": 21.0}, "freed_s": 0.4, "left": {},
    }  # fmt: skip
    text = report({"cancel": {"runs": [cancel]}, "timings_s": {"cancel": 40.0}})
    assert "| 0 (0 ms) | 19 / 21 / 1 | 5 / 16 / 0 / 0 = 21 | ok 21 | 0.40 s | none |" in text
    stuck = {**cancel, "freed_s": math.nan, "left": {"kv_1": 0.02}}
    assert "NOT within 15 s | kv_1 0.02 |" in report({"cancel": {"runs": [stuck]}})


def test_a_file_left_in_the_handoff_store_is_traced_to_the_request_aiperf_sent(
    tmp_path: Path,
) -> None:
    records = tmp_path / "tiny-openai-completions-concurrency1" / "profile_export.jsonl"
    records.parent.mkdir()
    cancelled = {
        "metadata": {"x_request_id": "1b73", "was_cancelled": True},
        "error": {"code": 499, "message": "Request cancelled 0.225s after being sent"},
    }
    completed = {"metadata": {"x_request_id": "74c4", "was_cancelled": False}}
    records.write_text(f"{json.dumps(cancelled)}\n{json.dumps(completed)}\n")  # fmt: skip
    sent = request_ids(tmp_path)
    assert sent == {"1b73": "Request cancelled 0.225s after being sent", "74c4": "completed"}
    left = {handoff_key("1b73-1") + ".kv", handoff_key("someone-else-1") + ".kv.part"}
    assert owners(left, sent) == {
        handoff_key("1b73-1") + ".kv": "1b73 (Request cancelled 0.225s after being sent)",
        handoff_key("someone-else-1") + ".kv.part": "?",
    }


def test_the_slowest_call_of_a_trace_is_split_into_the_time_spent_in_each_phase() -> None:
    seen = {
        "fast": {"queued": 0.0, "prefill": 0.1, "decode": 0.5, "last": 1.0},
        "stalled": {"queued": 2.0, "prefill": 2.1, "transfer": 2.4, "decode": 9.0, "last": 10.0},
    }
    spent = slowest(seen)
    assert spent["seen_s"] == pytest.approx(8.0)
    assert {p: round(s, 3) for p, s in spent.items() if p != "seen_s"} == {
        "queued": 0.1, "prefill": 0.3, "transfer": 6.6, "decode": 1.0,
    }  # fmt: skip
    assert slowest({}) == {}
    row = {"aiperf": json.loads(json.dumps(summarize(export()).__dict__)), "other_cpu_s": 0.5,
           "slowest": spent}  # fmt: skip
    table = report({"compare": {"pd": [row]}})
    assert "| 9325 | queued 100, prefill 300, transfer 6600, decode 1000 |" in table


def test_the_head_of_line_table_sets_the_short_call_after_the_cancels_beside_idle() -> None:
    def short(ttft: float, end: float, **extra: Any) -> dict[str, Any]:
        return {"ttft_s": ttft, "end_s": end, **extra}

    after = {"phases_at_hangup": ["queued", "prefill"], "cancelled_by_phase": {"queued": 2.0},
             "freed_s": 0.01}  # fmt: skip
    rows = {
        "none": [short(0.027, 0.148), short(0.029, 0.150)],
        "after_10": [short(0.052, 0.186, **after), short(0.060, 0.190, **after)],
        "after_10_freed": [short(0.025, 0.140, **after), short(0.031, 0.150, **after)],
    }
    table = report({"hol": rows})
    row = "| 1 | 27 / 148 | 52 / 186 | 25 / 140 | queued 1, prefill 1 | queued 2 | 0.01 s |"
    assert row in table
    assert "| median | 28 / 149 | 56 / 188 | 28 / 145 | | | |" in table
