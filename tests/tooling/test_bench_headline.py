"""The headline benchmark's arithmetic and its AIPerf command: what the completed requests got,
read from AIPerf's per-request records; the body AIPerf's template endpoint writes for Triton's
``generate``; the ratios the README's sentence quotes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import jinja2
import pytest

from bench.headline.load import Api, Load, Point, command, quantile, served
from bench.headline.report import headline, ratios

LOAD = Load(concurrency=8, requests=64, input_tokens=128, output_tokens=96)


def record(latency_ms: float, *, cancelled: bool = False, error: bool = False,
           usage: int | None = None, ttft_ms: float | None = None) -> dict[str, Any]:  # fmt: skip
    metrics: dict[str, Any] = {"request_latency": {"value": latency_ms, "unit": "ms"}}
    if usage is not None:
        metrics["usage_completion_tokens"] = {"value": usage, "unit": "tokens"}
    if ttft_ms is not None:
        metrics["time_to_first_token"] = {"value": ttft_ms, "unit": "ms"}
    found: dict[str, Any] = {"metadata": {"was_cancelled": cancelled}, "metrics": metrics}
    if cancelled or error:
        found["error"] = {"code": 499 if cancelled else 500, "message": "gone"}
    return found


def test_only_completed_requests_count_for_the_clients_who_stayed() -> None:
    records = [record(1000.0, usage=96, ttft_ms=50.0), record(3000.0, usage=90, ttft_ms=150.0),
               record(200.0, cancelled=True), record(10.0, error=True)]  # fmt: skip
    got = served(records, duration_s=2.0, output_tokens=96)
    assert (got.completed, got.cancelled, got.errors) == (2, 1, 1)
    assert got.delivered_tokens == 186  # the server's usage count, not the asked-for 96
    assert got.goodput == 93.0
    assert got.completed_per_min == 60.0
    assert got.latency_p50_ms == 2000.0 and got.latency_p99_ms == pytest.approx(2980.0)
    assert got.ttft_p50_ms == 100.0


def test_without_a_usage_count_a_completed_request_got_what_it_asked_for() -> None:
    got = served([record(500.0), record(700.0)], duration_s=1.0, output_tokens=96)
    assert got.delivered_tokens == 192
    assert math.isnan(got.ttft_p99_ms)  # answers that do not stream have no first token


def test_quantile_interpolates_between_order_statistics() -> None:
    assert quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert quantile([1.0], 0.99) == 1.0
    assert math.isnan(quantile([], 0.5))


def test_hang_ups_are_asked_of_aiperf_only_where_the_point_has_them(tmp_path: Path) -> None:
    chat = Api("chat", "tiny")
    calm = command(Path("aiperf"), "http://x", chat, LOAD, Point(0, "decode", False), 0.2,
                   tmp_path, tmp_path / "calm")  # fmt: skip
    assert "--request-cancellation-rate" not in calm
    hung = command(Path("aiperf"), "http://x", chat, LOAD, Point(25, "decode", True), 0.25,
                   tmp_path, tmp_path / "hung")  # fmt: skip
    at = hung.index("--request-cancellation-rate")
    assert hung[at + 1 : at + 4] == ["25", "--request-cancellation-delay", "0.250"]
    assert "--streaming" in hung and "ignore_eos:true" in hung


@pytest.mark.parametrize("streaming", [False, True])
def test_the_triton_template_renders_a_generate_body(tmp_path: Path, streaming: bool) -> None:
    """AIPerf renders the template with Jinja (autoescape on, as its template endpoint does) and
    parses the result as JSON: a prompt with quotes and newlines must survive."""
    api = Api("triton", "vllm_tiny", "/v2/models/vllm_tiny/generate")
    argv = api.arguments(LOAD, streaming, tmp_path)
    assert argv[argv.index("--custom-endpoint") + 1].endswith("generate_stream" if streaming
                                                              else "generate")  # fmt: skip
    template = next(a.split(":", 1)[1] for a in argv if a.startswith("payload_template:"))
    prompt = 'say "hi"\nand <stop> & go'
    rendered = jinja2.Environment(autoescape=True).from_string(Path(template).read_text())
    body = json.loads(rendered.render(text=prompt))
    assert body["text_input"] == prompt and body["stream"] is streaming
    sampling = json.loads(body["sampling_parameters"])
    assert sampling == {"max_tokens": 96, "ignore_eos": True, "temperature": 0}


def _runs(side: str, goodput: list[float], p99: list[float]) -> list[dict[str, Any]]:
    point = {"point": "50%-decode-answer", "side": side, "nobody_tokens": 0, "cancelled": 1}
    pairs = zip(goodput, p99, strict=True)
    return [{**point, "goodput": g, "latency_p99_ms": p} for g, p in pairs]


def test_the_headline_ratios_are_ratios_of_medians_hangup_over_the_other_side() -> None:
    pair = {"sides": ["triton", "bridge"], "labels": ["Triton direct", "hangup's bridge"],
            "runs": _runs("triton", [400, 500, 450], [2000, 1800, 2200])
            + _runs("bridge", [900, 800, 1000], [1000, 900, 1100])}  # fmt: skip
    assert ratios(pair, "50%-decode-answer") == (2.0, 2.0)
    (sentence,) = headline({"pairs": {"triton": pair}})
    assert "2.00x the goodput of Triton direct" in sentence and "2.00x lower p99" in sentence


def test_a_run_ends_once_the_engine_is_idle_and_its_token_count_stops_moving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Triton model records a request's tokens when it ends, after the engine's gauges may
    already say idle: the count read then must include them."""
    from bench.headline import __main__ as headline_main
    from bench.headline.pairs import Engine

    busy = iter([2, 1, 0, 0, 0, 0, 0])
    counts = iter([900, 960, 960, 960])  # read only while idle: 56+ tokens land after idle
    monkeypatch.setattr(headline_main.time, "sleep", lambda _: None)
    engine = Engine(generated=lambda: next(counts), busy=lambda: next(busy), kv=lambda: 0.0)
    headline_main._idle(engine)
    assert next(counts) == 960  # what the run reads next: the count with the late tokens in


def test_the_kv_chart_says_it_shows_one_run_where_the_others_show_the_rounds() -> None:
    """headline-kv.png draws round 1's series alone; its caption said "3 rounds, median and
    range" as the charts of medians do."""
    from bench.headline.charts import _caption

    results = json.loads((Path(__file__).parents[2] / "docs/img/headline.json").read_text())
    assert "one run (round 1 of 3)" in _caption(results, one_run=True)
    assert "3 rounds, median and range" not in _caption(results, one_run=True)
    assert "3 rounds, median and range" in _caption(results)
