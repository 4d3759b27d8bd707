"""Reading several processes' metrics files never fails a scrape: what cannot be read yet is
skipped for that scrape and reported, the rest is merged as prometheus_client merges it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from bench.base.scrape import parse, total
from hangup_contract.runtime.process_files import ProcessFiles
from tests.support.metrics_files import unreadable_files, write_counter


def _scrape(collector: object) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def test_unreadable_files_are_skipped_and_reported_and_the_rest_merged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_counter(tmp_path, 101, "hangup_calls", 3.0, model="m")
    write_counter(tmp_path, 102, "hangup_calls", 4.0, model="m")
    bad = unreadable_files(tmp_path)
    with pytest.raises(Exception, match="unpack_from"):  # what a scrape answered 500 on
        _scrape(MultiProcessCollector(None, path=str(tmp_path)))  # type: ignore[no-untyped-call]

    skipped: list[str] = []
    files = ProcessFiles(tmp_path, skipped.append)
    caplog.set_level(logging.WARNING, logger="hangup.metrics.files")
    samples = parse(_scrape(files))
    parse(_scrape(files))  # again: reported again, logged once

    assert total(samples, "hangup_calls_total", model="m") == 7.0
    assert total(samples, "hangup_cut_total") == 0  # the cut file's entry is not half-read
    assert skipped == bad * 2
    logged = [r for r in caplog.records if r.getMessage() == "metrics_file_skipped"]
    assert sorted(r.fields["file"] for r in logged) == bad  # type: ignore[attr-defined]


def test_a_file_readable_at_the_next_scrape_counts_again(tmp_path: Path) -> None:
    write_counter(tmp_path, 101, "hangup_calls", 3.0)
    starting = tmp_path / "counter_102.db"
    starting.touch()  # its process has created it, not sized it yet
    skipped: list[str] = []
    files = ProcessFiles(tmp_path, skipped.append)
    assert total(parse(_scrape(files)), "hangup_calls_total") == 3.0
    starting.unlink()
    write_counter(tmp_path, 102, "hangup_calls", 4.0)  # sized and written: readable
    assert total(parse(_scrape(files)), "hangup_calls_total") == 7.0
    assert skipped == ["counter_102.db"]


def test_keep_chooses_the_families(tmp_path: Path) -> None:
    write_counter(tmp_path, 101, "hangup_calls", 3.0)
    (tmp_path / "counter_102.db").write_bytes((tmp_path / "counter_101.db").read_bytes())
    write_counter(tmp_path, 103, "vllm_calls", 5.0)
    files = ProcessFiles(tmp_path, pytest.fail, keep=lambda name: name.startswith("hangup_"))
    samples = parse(_scrape(files))
    assert total(samples, "hangup_calls_total") == 6.0
    assert total(samples, "vllm_calls_total") == 0
