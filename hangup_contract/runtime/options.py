"""Options from the command line and the environment, built the same way for both processes.

A process declares its options as a table of :class:`Option`, its defaults as the fields of its
config dataclasses, and the sections ``--help`` shows them in. Every ``--some-option`` also reads
``<PREFIX>SOME_OPTION`` (``HANGUP_GATEWAY_`` or ``HANGUP_PROXY_``); a flag given on the command
line wins over the environment, which wins over the defaults. :meth:`OptionTable.parse` is the
only place either is read; nothing runs at import time.

Each option reads its text with a :class:`Kind` (the bare types ``int``, ``float``, ``str`` and
``Path`` stand for one): what the value is called in ``--help`` (its unit: ``SECONDS``,
``BYTES``...) and what a bad value is told to be instead. A value that does not read, a flag
nobody declared, a boolean given a value: each is a :class:`ConfigError` naming the flag (or
variable), the value and what is accepted. Booleans are plain flags (``--x``, ``--no-x``); their
variables take ``true`` or ``false``.
"""

from __future__ import annotations

import argparse
import difflib
import enum
import math
import re
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

DISTRIBUTION = "hangup"
OTHER_OPTIONS = "Other options"
"""The ``--help`` section of an option no section names (a test keeps it empty)."""


class ConfigError(ValueError):
    """Bad flags or environment: the process exits with this message before serving."""


@dataclass(frozen=True)
class Kind:
    """How an option's text becomes its value: ``read`` (raising ValueError), the value's name in
    ``--help`` (its unit), and what a bad value is told the option expects."""

    read: Callable[[str], object]
    metavar: str
    expected: str
    none: str | None = None
    """What a default of no value (None) means, where this kind makes one."""

    def __call__(self, text: str) -> object:
        try:
            return self.read(text)
        except ValueError as exc:
            raise ValueError(f"expected {self.expected}") from exc


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # nan, inf: no bound or timer means either
        raise ValueError(text)
    return value


def _seconds(text: str) -> float:
    value = _finite(text)
    if value < 0:
        raise ValueError(text)
    return value


def _optional_seconds(text: str) -> float | None:
    value = _finite(text)
    return None if value <= 0 else value


def _optional_size(text: str) -> int | None:
    value = int(text)
    return None if value <= 0 else value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError(text)
    return value


def _fraction(text: str) -> float:
    value = _finite(text)
    if not 0 < value <= 1:
        raise ValueError(text)
    return value


seconds = Kind(_seconds, "SECONDS", "seconds: a number, 0 or more (such as 2.5)")
optional_seconds = Kind(
    _optional_seconds, "SECONDS", "seconds: a number (0: no limit)", "`0` (no limit)"
)
"""Seconds, where 0 or less means no limit (None)."""
count = Kind(int, "N", "a whole number")
byte_size = Kind(int, "BYTES", "a number of bytes (a whole number)")
optional_size = Kind(_optional_size, "BYTES", "a number of bytes (0: no limit)", "`0` (no limit)")
"""A size, where 0 or less means no limit (None)."""


def _new_file(text: str) -> Path:
    path = Path(text)
    if not text or not path.parent.is_dir():
        raise ValueError(text)
    return path


new_file = Kind(_new_file, "PATH", "a file path in a directory that exists")
"""A file the process writes (the ready file): its directory is checked at start."""
port = Kind(_port, "PORT", "a port: a whole number from 0 to 65535 (0: any free port)")
fraction = Kind(_fraction, "FRACTION", "a number more than 0 and at most 1")

_BARE: Mapping[object, Kind] = {
    int: count,
    float: Kind(_finite, "NUMBER", "a number"),
    str: Kind(str, "TEXT", "text"),
    Path: Kind(Path, "PATH", "a path"),
}
_BOOLEAN = {"1": True, "true": True, "yes": True, "on": True}
_BOOLEAN |= {"0": False, "false": False, "no": False, "off": False, "": False}


def parse_bool(text: str) -> bool:
    """A boolean option's variable: true or false (also 1/0, yes/no, on/off)."""
    try:
        return _BOOLEAN[text.strip().lower()]
    except KeyError:
        raise ValueError("expected true or false (also 1 or 0, yes or no, on or off)") from None


def one_of(*choices: str, fold: Callable[[str], str] | None = None) -> Kind:
    """Exactly one of ``choices`` (``fold`` applied first: ``str.upper`` takes any case)."""

    def read(text: str) -> str:
        value = fold(text) if fold else text
        if value not in choices:
            raise ValueError(text)
        return value

    return Kind(read, "{" + ",".join(choices) + "}", "one of " + ", ".join(choices))


def choice(names: type[enum.StrEnum]) -> Kind:
    """A member of the string enum ``names``, by value."""
    values = [member.value for member in names]
    within = one_of(*values)
    return Kind(lambda text: names(str(within.read(text))), within.metavar, within.expected)


logging_level = one_of("DEBUG", "INFO", "WARNING", "ERROR", fold=str.upper)


@dataclass(frozen=True)
class Option:
    flag: str
    parse: Callable[[str], object]
    """A :class:`Kind`, a bare type (``int``, ``float``, ``str``, ``Path``), :func:`parse_bool`
    (a plain flag), or any function raising ValueError with what it expected."""
    help: str
    group: str | None = None
    """Where the value goes: the top-level config (None) or a named part of it."""
    field: str | None = None
    """The config field it sets (default: the flag's name with underscores)."""
    repeatable: bool = False
    """Given once or more on the command line, its values joined with commas for ``parse``
    (its variable holds them comma-separated)."""
    metavar: str | None = None
    """The value's name in ``--help`` (default: its kind's, such as ``SECONDS``)."""
    unset: str | None = None
    """What the default means where it is no value (None, empty): ``--help`` and the docs show
    this (Markdown: backticks are dropped in ``--help``)."""
    aliases: tuple[str, ...] = ()
    """Older names of the flag, still read, each with its variable (the flag's own name and
    variable win over them)."""

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def target(self) -> str:
        return self.field or self.dest

    @property
    def boolean(self) -> bool:
        return self.parse is parse_bool

    @property
    def kind(self) -> Kind | None:
        """How its text is read, where it is a :class:`Kind` or a bare type."""
        if isinstance(self.parse, Kind):
            return self.parse
        return _BARE.get(self.parse)

    def env(self, prefix: str) -> str:
        return prefix + self.dest.upper()

    def envs(self, prefix: str) -> tuple[str, ...]:
        """Its variable, then its aliases' (the first one set is read)."""
        names = (self.flag, *self.aliases)
        return tuple(prefix + name.removeprefix("--").replace("-", "_").upper() for name in names)


@dataclass(frozen=True)
class OptionTable:
    prog: str
    description: str
    env_prefix: str
    options: tuple[Option, ...]
    defaults: Mapping[str | None, Any]
    """The dataclass whose fields' defaults are each group's options' defaults, by group."""
    sections: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """``--help``'s sections, in order: a title and the flags under it."""
    groups: tuple[str, ...] = ()
    """The named parts of the config (an option's ``group``)."""
    usage: str = "%(prog)s [OPTION ...]"
    epilog: str = ""

    def section_of(self, option: Option) -> str:
        for title, flags in self.sections:
            if option.flag in flags:
                return title
        return OTHER_OPTIONS

    def by_section(self) -> Iterator[tuple[str, list[Option]]]:
        """Each section's title and its options, in ``--help``'s order (a section of options
        nobody placed last)."""
        placed: dict[str, list[Option]] = {title: [] for title, _ in self.sections}
        placed[OTHER_OPTIONS] = []
        for option in self.options:
            placed[self.section_of(option)].append(option)
        for title, options in placed.items():
            if options:
                yield title, sorted(options, key=self._place)

    def _place(self, option: Option) -> int:
        flags = dict(self.sections).get(self.section_of(option), ())
        return flags.index(option.flag) if option.flag in flags else len(flags)

    def default(self, option: Option) -> object:
        """The value an option has when neither its flag nor its variable is given."""
        for f in fields(self.defaults[option.group]):
            if f.name == option.target:
                if f.default is not MISSING:
                    return f.default
                if f.default_factory is not MISSING:
                    return f.default_factory()
        return None  # an option read into something else (a token file into the token)

    def default_text(self, option: Option) -> str:
        """The default as the docs' tables write it (Markdown)."""
        return render_default(option, self.default(option))

    def parser(self) -> argparse.ArgumentParser:
        parser = _Parser(
            prog=self.prog,
            usage=self.usage,
            description=self.description,
            epilog=self.epilog
            or f"Every option also reads the variable shown beside it ({self.env_prefix}<OPTION>); "
            "a flag wins over its variable. A boolean's variable takes true or false.",
            formatter_class=_Formatter,
            add_help=False,
            allow_abbrev=False,  # a flag added later never changes what a short one meant
        )
        about = parser.add_argument_group("About")
        about.add_argument("-h", "--help", action="help", help="show this help and exit")
        about.add_argument(
            "--version", action="version", version=f"%(prog)s {version()}", help="show the version"
        )
        for title, options in self.by_section():
            section = parser.add_argument_group(title)
            for option in options:
                more = "; repeat the flag for more" if option.repeatable else ""
                help_text = option.help.replace("%", "%%") + more + "\n" + self._footer(option)
                if option.boolean:
                    section.add_argument(
                        option.flag,
                        *option.aliases,
                        dest=option.dest,
                        default=None,
                        action=argparse.BooleanOptionalAction,
                        help=help_text,
                    )
                else:
                    section.add_argument(
                        option.flag,
                        *option.aliases,
                        dest=option.dest,
                        default=None,
                        action="append" if option.repeatable else "store",
                        metavar=option.metavar or (option.kind.metavar if option.kind else "VALUE"),
                        help=help_text,
                    )
        return parser

    def _footer(self, option: Option) -> str:
        default = self.default_text(option).replace("`", "")
        return f"[default: {default}] [env: {option.env(self.env_prefix)}]".replace("%", "%%")

    def parse(
        self, argv: Sequence[str], environ: Mapping[str, str]
    ) -> dict[str | None, dict[str, Any]]:
        """The values given, by group and config field (unset options are left out); each
        value is what its option's ``parse`` made, of the type of the field it is named for.

        Raises ConfigError naming the flag (or variable), the bad value and what it accepts.
        """
        self._refuse_boolean_values(argv)
        given = vars(self.parser().parse_args(list(argv)))
        values: dict[str | None, dict[str, Any]] = {None: {}}
        values.update({name: {} for name in self.groups})
        for option in self.options:
            raw, source = given[option.dest], option.flag
            variable = next((v for v in option.envs(self.env_prefix) if v in environ), None)
            if raw is None and variable is not None:
                raw, source = environ[variable], variable
            if raw is None:
                continue
            if isinstance(raw, list):  # a repeatable option: each value it was given
                raw = ",".join(raw)
            try:
                value = raw if isinstance(raw, bool) else option.parse(raw)
            except ValueError as exc:
                raise ConfigError(f"{source}={raw!r}: {exc}") from exc
            values[option.group][option.target] = value
        return values

    def _refuse_boolean_values(self, argv: Sequence[str]) -> None:
        """``--flag true`` and ``--flag=true`` for a boolean: the flag alone says it."""
        booleans = {o.flag: o for o in self.options if o.boolean}
        for i, arg in enumerate(argv):
            flag, eq, value = arg.partition("=")
            following = argv[i + 1] if i + 1 < len(argv) else None
            if flag in booleans and (eq or (following or "-").lower() in _BOOLEAN):
                option, given = booleans[flag], value if eq else following
                raise ConfigError(
                    f"{flag} takes no value ({given!r} given): "
                    f"{flag} turns it on, --no-{flag[2:]} off "
                    f"({option.env(self.env_prefix)} takes true or false)"
                )


def render_default(option: Option, value: object) -> str:
    """A default as a Markdown cell writes it: a value in backticks, or the option's words for
    no value (``unset``); ``--help`` shows the same without the backticks."""
    if value is None or value == "" or value == ():
        return option.unset or (option.kind and option.kind.none) or "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, enum.Enum):
        return f"`{value.value}`"
    if isinstance(value, tuple):
        return "`" + ",".join(map(str, value)) + "`"
    if isinstance(value, float):
        return f"`{_number(value)}`"
    if isinstance(value, int) and option.kind in (byte_size, optional_size):
        return f"`{value}`" + _binary(value)
    return f"`{value}`"


def _number(value: float) -> str:
    """``0.00002`` as written, not ``2e-05``; ``30.0`` as ``30``."""
    text = f"{value:.10f}".rstrip("0").rstrip(".")
    return text if float(text) == value else repr(value)


def _binary(size: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f" ({size >> shift} {unit})"
    return ""


def version() -> str:
    """This installation's version, from the distribution's metadata."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed: no version)"


class _Formatter(argparse.HelpFormatter):
    """Each option's help as written (its lines kept: the default and variable on their own),
    wrapped to the terminal; the usage line as the table gives it."""

    def __init__(self, prog: str) -> None:
        width = min(100, shutil.get_terminal_size().columns - 2)
        super().__init__(prog, max_help_position=34, width=width)

    def _split_lines(self, text: str, width: int) -> list[str]:
        lines = []
        for part in text.splitlines():
            if part.startswith("[default: ") and len(part) > width:  # a variable's name whole
                lines += part.replace("] [env: ", "]\n[env: ").splitlines()
            else:
                lines += super()._split_lines(part, width)
        return lines


class _Parser(argparse.ArgumentParser):
    """argparse, whose errors (an unknown flag, a missing value) are ConfigErrors naming the
    flag, and a likely spelling for an unknown one."""

    def error(self, message: str) -> NoReturn:
        bare = re.match(r"argument (--[\w-]+).*: expected one argument", message)
        if bare:
            action = self._option_string_actions[bare.group(1)]
            message = f"{bare.group(1)} needs a value ({action.metavar})"
        unknown = re.match(r"unrecognized arguments: (.*)", message)
        if unknown:
            flags = [a for a in self._option_string_actions if a.startswith("--")]
            words = []
            for arg in unknown.group(1).split():
                near = difflib.get_close_matches(arg.partition("=")[0], flags, n=1)
                words.append(f"{arg} (did you mean {near[0]}?)" if near else arg)
            message = "unknown option: " + ", ".join(words)
        raise ConfigError(f"{message} ({self.prog} --help lists every option)")
