"""Options from the command line and the environment, built the same way for both processes.

A process declares its options as a table of :class:`Option`. Every ``--some-option`` also reads
``<PREFIX>SOME_OPTION`` (``HANGUP_GATEWAY_`` or ``HANGUP_PROXY_``); a flag given on the command
line wins over the environment, which wins over the process's defaults (its config dataclass).
:func:`parse_options` is the only place either is read; nothing runs at import time. A value
that does not parse is a :class:`ConfigError` naming the flag or variable and the value.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """Bad flags or environment: the process exits with this message before serving."""


@dataclass(frozen=True)
class Option:
    flag: str
    parse: Callable[[str], object]
    help: str
    group: str | None = None
    """Where the value goes: the top-level config (None) or a named part of it."""
    field: str | None = None
    """The config field it sets (default: the flag's name with underscores)."""
    negatable: bool = False
    """A boolean with a ``--no-`` form (``--enable-x`` / ``--no-enable-x``)."""
    repeatable: bool = False
    """Given once or more on the command line, its values joined with commas for ``parse``
    (its variable holds them comma-separated)."""

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def target(self) -> str:
        return self.field or self.dest

    def env(self, prefix: str) -> str:
        return prefix + self.dest.upper()


@dataclass(frozen=True)
class OptionTable:
    prog: str
    description: str
    env_prefix: str
    options: tuple[Option, ...]
    groups: Mapping[str, str] | None = None
    """Help titles of the option groups, by group name."""

    def parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(
            prog=self.prog,
            description=self.description,
            epilog=f"Every option also reads {self.env_prefix}<OPTION> "
            f"(e.g. {self.env_prefix}HTTP_PORT); a flag wins over the variable.",
        )
        sections: dict[str | None, argparse._ActionsContainer] = {None: parser}
        for name, title in (self.groups or {}).items():
            sections[name] = parser.add_argument_group(title)
        for option in self.options:
            section = sections[option.group]
            if option.negatable:
                section.add_argument(
                    option.flag,
                    dest=option.dest,
                    default=None,
                    action=argparse.BooleanOptionalAction,
                    help=option.help,
                )
            elif option.repeatable:
                section.add_argument(
                    option.flag, dest=option.dest, default=None, action="append", help=option.help
                )
            elif option.parse is parse_bool:  # a bare flag means true; a value may follow
                section.add_argument(
                    option.flag,
                    dest=option.dest,
                    nargs="?",
                    const="true",
                    default=None,
                    help=option.help,
                )
            else:
                section.add_argument(option.flag, dest=option.dest, default=None, help=option.help)
        return parser

    def parse(
        self, argv: Sequence[str], environ: Mapping[str, str]
    ) -> dict[str | None, dict[str, Any]]:
        """The values given, by group and config field (unset options are left out); each
        value is what its option's ``parse`` made, of the type of the field it is named for.

        Raises ConfigError naming the flag (or variable) and the bad value.
        """
        given = vars(self.parser().parse_args(list(argv)))
        values: dict[str | None, dict[str, Any]] = {None: {}}
        values.update({name: {} for name in self.groups or {}})
        for option in self.options:
            raw, source = given[option.dest], option.flag
            if raw is None and option.env(self.env_prefix) in environ:
                raw, source = environ[option.env(self.env_prefix)], option.env(self.env_prefix)
            if raw is None:
                continue
            if isinstance(raw, list):  # a repeatable option: each value it was given
                raw = ",".join(raw)
            parse = parse_bool if option.negatable else option.parse
            try:
                values[option.group][option.target] = raw if isinstance(raw, bool) else parse(raw)
            except ValueError as exc:
                raise ConfigError(f"{source}={raw!r}: {exc}") from exc
        return values


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"not a boolean: {text!r}")


def optional_seconds(text: str) -> float | None:
    """Seconds, where 0 or less means no limit (None)."""
    value = float(text)
    return None if value <= 0 else value


def optional_size(text: str) -> int | None:
    """A size, where 0 or less means no limit (None)."""
    value = int(text)
    return None if value <= 0 else value


def one_of(*choices: str) -> Callable[[str], str]:
    """A parser accepting exactly one of ``choices``."""

    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected {' or '.join(choices)}")
        return text

    return parse
