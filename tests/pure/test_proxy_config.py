"""The proxy's configuration: the documented defaults, flags over HANGUP_PROXY_* over defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from hangup_contract.runtime.options import ConfigError
from proxy.config import AdapterName, Config, build_config


def test_defaults_are_the_documented_ones() -> None:
    config = build_config([], {})
    assert (config.host, config.http_port, config.grpc_port, config.admin_port) == (
        "127.0.0.1",
        8080,
        8081,
        9090,
    )
    assert config.upstream_http == "http://127.0.0.1:8000"
    assert config.upstream_grpc == "127.0.0.1:8001"
    assert config.cancel_adapter is AdapterName.HANGUP
    assert config.cancel_base_url == "http://127.0.0.1:8000"


def test_environment_is_read_and_flags_win(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    env = {
        "HANGUP_PROXY_HTTP_PORT": "0",
        "HANGUP_PROXY_ADMIN_PORT": "9999",
        "HANGUP_PROXY_CANCEL_TOKEN_FILE": str(token),
        "HANGUP_PROXY_TRUST_CLIENT_REQUEST_ID": "true",
        "HANGUP_PROXY_MAX_REQUEST_DURATION": "0",
        "HANGUP_PROXY_CANCEL_ADAPTER": "none",
    }
    config = build_config(["--admin-port", "0", "--upstream-http", "http://127.0.0.1:1/"], env)
    assert config == Config(
        http_port=0,
        admin_port=0,
        upstream_http="http://127.0.0.1:1/",
        cancel_token="t0ken",
        trust_client_request_id=True,
        max_request_duration=None,
        cancel_adapter=AdapterName.NONE,
    )
    assert config.cancel_base_url == "http://127.0.0.1:1"


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--http-port", "eighty"], {}, "--http-port"),
        ([], {"HANGUP_PROXY_GRPC_PORT": "70000"}, "HANGUP_PROXY_GRPC_PORT=.*from 0 to 65535"),
        (["--cancel-adapter", "envoy"], {}, "--cancel-adapter"),
        (["--upstream-http", "127.0.0.1:8000"], {}, "--upstream-http"),
        (
            [],
            {"HANGUP_PROXY_TRUST_CLIENT_REQUEST_ID": "maybe"},
            "HANGUP_PROXY_TRUST_CLIENT_REQUEST_ID",
        ),
        (["--cancel-token-file", "/nonexistent/token"], {}, "--cancel-token-file"),
        (["--cancel-deadline", "0"], {}, "--cancel-deadline"),
        (["--workers", "0"], {}, "--workers"),
        (["--body-timeout", "-1"], {}, "--body-timeout"),
        (["--scrape-paths", "/metrics,metrics"], {}, "--scrape-paths"),
        (["--cancel-pool", "https://pods:8000"], {}, "--cancel-pool"),
        (["--cancel-pool", "http://pods"], {}, "--cancel-pool"),
        (["--cancel-pool", "http://pods:8000", "--cancel-adapter", "vllm"], {}, "--cancel-pool"),
        (["--cancel-pool", "http://pods:8000", "--cancel-url", "http://a:1"], {}, "--cancel-pool"),
        (["--cancel-pool-max", "0"], {}, "--cancel-pool-max"),
        (["--ended-ids-max", "0"], {}, "--ended-ids-max"),
        (["--ended-ids-max-bytes", "-1"], {}, "--ended-ids-max-bytes"),
        (["--tombstones-max", "0"], {}, "--tombstones-max"),
        (["--tombstones-max-bytes", "0"], {}, "--tombstones-max-bytes"),
    ],
)
def test_bad_settings_name_the_option(argv: list[str], env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        build_config(argv, env)


@pytest.mark.parametrize("ttl", ["-5", "0", "nan", "inf", "-inf", "3601", "1e308"])
def test_a_tombstone_ttl_outside_its_range_is_refused_naming_the_flag_and_range(ttl: str) -> None:
    with pytest.raises(ConfigError, match=r"--tombstone-ttl=.*more than 0 and at most 3600"):
        build_config([f"--tombstone-ttl={ttl}"], {})
    assert build_config(["--tombstone-ttl", "0.5"], {}).tombstone_ttl == 0.5
    assert build_config(["--tombstone-ttl", "3600"], {}).tombstone_ttl == 3600


def test_a_cancel_pool_is_a_list_of_base_urls() -> None:
    config = build_config(["--cancel-pool", "http://pods.ns.svc:8000/, http://10.0.0.7:8000"], {})
    assert config.cancel_pool == ("http://pods.ns.svc:8000", "http://10.0.0.7:8000")


def test_empty_token_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        build_config(["--cancel-token-file", str(tmp_path / "token")], {})


def test_scrape_paths_are_a_list_or_none() -> None:
    assert build_config([], {}).scrape_paths == ("/metrics", "/metrics/pool")
    assert build_config(["--scrape-paths", " /a , /b "], {}).scrape_paths == ("/a", "/b")
    assert build_config([], {"HANGUP_PROXY_SCRAPE_PATHS": ""}).scrape_paths == ()


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["--max-header-bytes", "4096"], {}),  # the gateway's name for the same limit
        (["--max-header-size", "4096"], {}),  # the proxy's earlier name, still read
        ([], {"HANGUP_PROXY_MAX_HEADER_BYTES": "4096"}),
        ([], {"HANGUP_PROXY_MAX_HEADER_SIZE": "4096"}),
        (["--max-header-bytes", "4096"], {"HANGUP_PROXY_MAX_HEADER_SIZE": "100"}),  # flag wins
        ([], {"HANGUP_PROXY_MAX_HEADER_BYTES": "4096", "HANGUP_PROXY_MAX_HEADER_SIZE": "100"}),
    ],
)
def test_the_header_limit_reads_both_its_names(argv: list[str], env: dict[str, str]) -> None:
    assert build_config(argv, env).max_header_size == 4096


def test_the_header_limits_old_name_is_in_help_and_a_bad_value_names_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_config(["--help"], {})
    assert "--max-header-bytes BYTES, --max-header-size BYTES" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="--max-header-bytes='lots'"):
        build_config(["--max-header-size", "lots"], {})
