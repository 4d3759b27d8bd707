"""Both command lines as a user meets them: ``--help`` shows every option under its section,
with its unit, its default and its variable; ``--version`` says the installed version; a bad
flag or value is refused naming the flag (or variable), the value and what is accepted."""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import pytest

from gateway_server.cli import main as gateway_main
from gateway_server.config import OPTION_TABLE as GATEWAY
from gateway_server.config import from_args
from hangup_contract.runtime.options import (
    OTHER_OPTIONS,
    ConfigError,
    OptionTable,
    fraction,
    optional_seconds,
    seconds,
)
from proxy.cli import main as proxy_main
from proxy.config import OPTION_TABLE as PROXY
from proxy.config import build_config

COMMANDS: dict[str, tuple[OptionTable, Callable[[list[str]], None]]] = {
    "hangup-proxy": (PROXY, proxy_main),
    "hangup-gateway": (GATEWAY, gateway_main),
}


def parse_with(table: OptionTable, argv: list[str], environ: dict[str, str]) -> object:
    if table is PROXY:
        return build_config(argv, environ)
    return from_args(argv, environ)


def printed(
    capsys: pytest.CaptureFixture[str], main: Callable[[list[str]], None], argv: list[str]
) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    return capsys.readouterr().out


def help_blocks(text: str) -> dict[str, tuple[str, str]]:
    """Each option's lines in ``--help`` (its flag's line and what follows, up to the next
    option or section), by flag, with the title of the section it is under."""
    blocks: dict[str, tuple[str, str]] = {}
    section, flag = "", None
    for line in text.splitlines():
        if re.match(r"^\S.*:$", line):
            section, flag = line[:-1], None
        elif match := re.match(r"^  (--[\w-]+)", line):
            flag = match.group(1)
            blocks[flag] = (section, line)
        elif flag and line.startswith("    "):
            blocks[flag] = (section, blocks[flag][1] + "\n" + line)
        else:
            flag = None
    return blocks


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_every_option_in_its_section_with_unit_default_and_variable(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    table, main = COMMANDS[command]
    text = printed(capsys, main, ["--help"])
    blocks = help_blocks(text)
    for option in table.options:
        assert option.flag in blocks, f"{option.flag} is not in {command} --help"
        section, block = blocks[option.flag]
        assert section == table.section_of(option) != OTHER_OPTIONS, option.flag
        default = table.default_text(option).replace("`", "")
        assert f"[default: {default}]" in block, f"{option.flag}: no default in\n{block}"
        assert f"[env: {option.env(table.env_prefix)}]" in block, option.flag
        first = block.splitlines()[0].split()
        if option.boolean:  # a plain flag, and its negation, taking no value
            assert first[:2] == [f"{option.flag},", f"--no-{option.flag[2:]}"], block
        else:
            unit = option.metavar or (option.kind.metavar if option.kind else None)
            assert first[1].rstrip(",") == unit, f"{option.flag}: no unit in {first}"
    titles = [line[:-1] for line in text.splitlines() if re.match(r"^\S.*:$", line)]
    assert titles == ["About", *(title for title, _ in table.sections)]
    assert "docs/" not in text, "an installed copy has no docs/ folder to point to"


@pytest.mark.parametrize("command", COMMANDS)
def test_version_is_the_installed_distributions(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, main = COMMANDS[command]
    assert printed(capsys, main, ["--version"]) == f"{command} {metadata.version('hangup')}\n"


# What a user gives wrong, per kind of value, and what the refusal must say.
BAD = [
    # whole numbers, ports, bytes
    (PROXY, ["--workers", "two"], {}, "--workers='two': expected a whole number"),
    (GATEWAY, ["--http-port", "70000"], {}, "--http-port='70000': expected a port.* 0 to 65535"),
    (GATEWAY, ["--max-body-bytes", "8MiB"], {}, "--max-body-bytes='8MiB': expected a number of"),
    (GATEWAY, [], {"HANGUP_GATEWAY_WORKERS": "x"}, "HANGUP_GATEWAY_WORKERS='x': expected a whole"),
    # durations and fractions
    (PROXY, ["--drain-timeout", "soon"], {}, "--drain-timeout='soon': expected seconds"),
    (PROXY, ["--drain-timeout", "-1"], {}, "--drain-timeout='-1': expected seconds: .* 0 or more"),
    (GATEWAY, ["--responses-ttl", "inf"], {}, "--responses-ttl='inf': expected seconds"),
    (PROXY, ["--max-request-duration=nan"], {}, "--max-request-duration='nan': expected seconds"),
    (GATEWAY, ["--gpu-memory-utilization", "1.5"], {}, "'1.5': expected a number more than 0 and"),
    # choices
    (PROXY, ["--cancel-adapter", "envoy"], {}, "'envoy': expected one of hangup, vllm, sglang"),
    (GATEWAY, ["--engine", "tgi"], {}, "--engine='tgi': expected one of sim, vllm"),
    (GATEWAY, ["--log-level", "loud"], {}, "'loud': expected one of DEBUG, INFO, WARNING, ERROR"),
    # paths
    (PROXY, ["--ready-file", "/nonexistent/dir/ready"], {}, "--ready-file=.*a directory that ex"),
    (GATEWAY, ["--cancel-token-file", "/nonexistent/token"], {}, "--cancel-token-file .*No such"),
    # repeatable and list flags
    (PROXY, ["--allow-admin-path", "v2/repository"], {}, "--allow-admin-path='v2/repository': no"),
    (PROXY, ["--allow-admin-path", "/x", "--allow-admin-path", "/v2/**"], {}, "'/x' is not an adm"),
    (PROXY, ["--scrape-paths", "metrics"], {}, "--scrape-paths='metrics': not a path"),
    (PROXY, ["--upstream-grpc", "gateway"], {}, "--upstream-grpc='gateway'"),
    # booleans: the flag alone, or its variable's true/false
    (PROXY, ["--trust-client-request-id", "true"], {}, "takes no value .* --no-trust-client-req"),
    (GATEWAY, ["--sim-faults=yes"], {}, "--sim-faults takes no value \\('yes' given\\)"),
    (PROXY, [], {"HANGUP_PROXY_VLLM_ABORT_ENDPOINT": "maybe"}, "expected true or false"),
    # flags nobody declared, and a flag without its value
    (PROXY, ["--drain-timout", "3"], {}, "unknown option: --drain-timout \\(did you mean --drai"),
    (GATEWAY, ["--http-port"], {}, "--http-port needs a value \\(PORT\\)"),
]


@pytest.mark.parametrize(("table", "argv", "environ", "said"), BAD)
def test_a_bad_flag_is_refused_naming_it_and_what_it_takes(
    table: OptionTable, argv: list[str], environ: dict[str, str], said: str
) -> None:
    with pytest.raises(ConfigError, match=said):
        parse_with(table, argv, environ)


NUMBERS = {seconds.metavar, optional_seconds.metavar, fraction.metavar, "NUMBER"}


@pytest.mark.parametrize("table", [PROXY, GATEWAY], ids=["proxy", "gateway"])
@pytest.mark.parametrize("text", ["nan", "inf", "-inf"])
def test_no_number_option_takes_a_value_that_is_not_a_number(table: OptionTable, text: str) -> None:
    """nan compares false with every bound, so a range check let it through as a timeout or a
    delay; every option read as a number refuses it at start."""
    numbers = [o for o in table.options if o.kind and o.kind.metavar in NUMBERS]
    assert len(numbers) > 10
    for option in numbers:
        with pytest.raises(ConfigError, match=f"^{option.flag}='{text}': expected"):
            parse_with(table, [f"{option.flag}={text}"], {})


def test_the_ready_file_is_refused_at_start_where_it_could_not_be_written(tmp_path: Path) -> None:
    """It was written only once the process served: a directory that did not exist ended the
    serving process with a traceback instead."""
    assert build_config(["--ready-file", str(tmp_path / "ready")], {}).ready_file
    with pytest.raises(ConfigError, match="--ready-file="):
        build_config(["--ready-file", str(tmp_path / "missing" / "ready")], {})


def test_booleans_are_flags_and_their_variables_take_true_or_false() -> None:
    assert build_config(["--trust-client-request-id"], {}).trust_client_request_id
    env = {"HANGUP_PROXY_TRUST_CLIENT_REQUEST_ID": "true"}
    assert build_config([], env).trust_client_request_id
    assert not build_config(["--no-trust-client-request-id"], env).trust_client_request_id
    assert not build_config(
        [], {"HANGUP_PROXY_TRUST_CLIENT_REQUEST_ID": "off"}
    ).trust_client_request_id
