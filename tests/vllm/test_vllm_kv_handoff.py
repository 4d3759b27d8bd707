"""hangup's KV connector between two real vLLM engines (tiny model, CPU): the decode engine
loads the prompt's KV that the prefill engine saved, rather than computing it again, and
answers exactly what one engine alone answers; the handoff store ends empty.

The two engines run in a process of their own (:mod:`tests.support.kv_handoff_probe`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.base.processes import REPO, child_env
from bench.harness.vllm_stack import START_TIMEOUT_S
from tests.support.vllm_fixtures import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]


@pytest.fixture(scope="module")
def probe(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    store = tmp_path_factory.mktemp("handoff-store")
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.kv_handoff_probe", str(tiny_model), str(store)],
        env=child_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["files_left"] = sorted(p.name for p in store.iterdir())
    return result


def test_decode_loads_the_prompts_whole_blocks_instead_of_computing_them(
    probe: dict[str, Any],
) -> None:
    block = probe["block_size"]
    whole_blocks = (probe["prompt_tokens"] - 1) // block * block
    assert whole_blocks >= block, "the prompt is too short to hand a block over"
    assert probe["held_after_prefill"] == whole_blocks // block
    assert probe["handoff_blocks"] == whole_blocks // block
    assert probe["loaded"] == whole_blocks  # vLLM's num_cached_tokens: not computed again


def test_disaggregated_text_equals_one_engines_text_at_temperature_zero(
    probe: dict[str, Any],
) -> None:
    assert probe["aggregated"]
    assert probe["pd"] == probe["aggregated"]


def test_decode_answers_from_the_kv_it_loaded(probe: dict[str, Any]) -> None:
    """The control: the handoff's KV zeroed, loaded just the same, changes the answer."""
    assert probe["zeroed_loaded"] == probe["loaded"]
    assert probe["zeroed_pd"] != probe["aggregated"]


def test_the_handoff_is_deleted_once_loaded_or_released(probe: dict[str, Any]) -> None:
    assert probe["held_after_decode"] == 0
    assert probe["released_blocks"] > 0
    assert probe["held_after_release"] == 0
    # Released before decode came: nothing to load, the prompt is computed, same answer.
    assert probe["loaded_after_release"] == 0
    assert probe["other_pd"] == probe["other_aggregated"]
    assert probe["files_left"] == []
    assert probe["idle"] == [True, True]


def test_a_handoff_that_cannot_be_loaded_is_computed_instead(probe: dict[str, Any]) -> None:
    assert probe["damaged_pd"] == probe["aggregated"]
    assert probe["damaged_alive"]
