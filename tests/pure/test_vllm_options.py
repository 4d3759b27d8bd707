"""vLLM engine options and GPU assignment: pure logic, no vLLM needed (so no ``vllm`` marker)."""

from __future__ import annotations

import os

import pytest

from gateway_server.config import from_args
from gateway_server.engine.base import EngineError
from gateway_server.engine.devices import DevicePin, device_env, device_groups
from gateway_server.engine.vllm.options import VllmOptions


def test_engine_options_from_flags_reach_vllm_engine_args() -> None:
    config = from_args(
        ["--engine", "vllm", "--model", "m", "--dtype", "bfloat16", "--max-model-len", "4096",
         "--max-num-batched-tokens", "64", "--kv-cache-memory-bytes", "1048576",
         "--no-enable-prefix-caching", "--enforce-eager", "--tensor-parallel-size", "2"],
        environ={},
    )  # fmt: skip
    assert config.engine_settings.engine_args() == {
        "dtype": "bfloat16",
        "gpu_memory_utilization": 0.9,
        "tensor_parallel_size": 2,
        "enforce_eager": True,
        "max_model_len": 4096,
        "max_num_batched_tokens": 64,
        "kv_cache_memory_bytes": 1048576,
        "enable_prefix_caching": False,
    }


def test_engine_options_from_the_environment_and_vllm_defaults_left_alone() -> None:
    environ = {
        "HANGUP_GATEWAY_MAX_NUM_SEQS": "16",
        "HANGUP_GATEWAY_ENABLE_PREFIX_CACHING": "true",
        "HANGUP_GATEWAY_ENFORCE_EAGER": "1",
    }
    options = from_args(["--engine", "vllm", "--model", "m"], environ=environ).engine_settings
    assert options == VllmOptions(max_num_seqs=16, enable_prefix_caching=True, enforce_eager=True)
    args = options.engine_args()
    for unset in ("max_model_len", "max_num_batched_tokens", "kv_cache_memory_bytes"):
        assert unset not in args  # vLLM picks its own default


def test_each_worker_gets_its_own_gpus() -> None:
    assert device_groups(2, 1, ["0", "1"]) == [("0",), ("1",)]
    assert device_groups(2, 2, ["4", "5", "6", "7"]) == [("4", "5"), ("6", "7")]
    assert device_groups(1, 1, ["3", "1"]) == [("3",)]


def test_too_few_gpus_is_a_clear_error() -> None:
    with pytest.raises(EngineError, match=r"2 worker\(s\) x tensor parallel size 2 need 4 GPU"):
        device_groups(2, 2, ["0", "1", "2"])


def test_a_worker_sees_only_its_gpus_while_its_engine_core_is_spawned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    with device_env(DevicePin("CUDA_VISIBLE_DEVICES", ("2", "3"))):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with device_env(DevicePin("CUDA_VISIBLE_DEVICES", ("1",))):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
