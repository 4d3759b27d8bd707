"""The docs' reference tables, read as Markdown and compared with what they document: the flags
of both commands (their option tables), the metrics both processes declare, the chart's values
(``values.schema.json`` and ``values.yaml``). Each ``*_drift`` returns what differs, one line a
difference, naming the page, the row and what the source says (for a missing flag, the row to
paste); an empty list means the page is exact. The tables stay written by hand: only the cells
a source decides (a flag's name, section and default; a metric's name and labels; a value's
name and default) are compared, never the prose.

``python -m tests.support.references`` prints every drift (the same the docs tests fail on).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hangup_contract.runtime.options import OTHER_OPTIONS, Option, OptionTable

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "hangup"


@dataclass(frozen=True)
class Row:
    heading: str
    """The nearest heading above the table (its text, without the #s)."""
    cells: tuple[str, ...]
    line: int


def table_rows(text: str, under: str | None = None) -> Iterator[Row]:
    """Every body row of every table in ``text`` (header and rule rows left out); with
    ``under``, only tables below the ``##`` heading of that text, up to the next ``##``."""
    heading, inside = "", under is None
    header_next = False
    for number, line in enumerate(text.splitlines(), 1):
        if match := re.match(r"^(#+) (.*)", line):
            heading = match.group(2).strip()
            if under is not None and len(match.group(1)) == 2:
                inside = heading == under
            continue
        if not inside or not line.startswith("|"):
            header_next = True  # the next table's first row is its header
            continue
        cells = tuple(c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1])
        if header_next:
            header_next = False
            continue
        if set("".join(cells)) <= set("-: "):
            continue
        yield Row(heading, cells, number)


def _shown(page: Path) -> str:
    return str(page.relative_to(REPO)) if page.is_relative_to(REPO) else str(page)


def backticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


# -- flags -------------------------------------------------------------------------------------

FLAGS_SECTION = "Command line"


def _flag_row(table: OptionTable, option: Option) -> str:
    return f"| `{option.flag}` | {table.default_text(option)} | {option.help} |"


def flag_drift(page: Path, table: OptionTable) -> list[str]:
    """How ``page``'s "Command line" tables differ from ``table``: a flag missing or unknown,
    under another section than ``--help``'s, or with another default."""
    name = _shown(page)
    options = {spelling: o for o in table.options for spelling in (o.flag, *o.aliases)}
    seen: dict[str, int] = {}
    drift = []
    for row in table_rows(page.read_text(), FLAGS_SECTION):
        flags = [f for f in backticked(row.cells[0]) if f.startswith("--")]
        if not flags:
            drift.append(f"{name}:{row.line}: a row naming no flag: {row.cells[0]!r}")
            continue
        unknown = [f for f in flags if f not in options]
        for flag in unknown:
            drift.append(
                f"{name}:{row.line}: {flag} is documented but {table.prog} has no such flag"
            )
        # A flag and its alias (its older name) are one option.
        known = list({options[f].flag: options[f] for f in flags if f in options}.values())
        for option in known:
            if option.flag in seen:
                drift.append(
                    f"{name}:{row.line}: {option.flag} again (first on line {seen[option.flag]})"
                )
            seen[option.flag] = row.line
            section = table.section_of(option)
            if section != row.heading.replace("`", ""):
                drift.append(
                    f"{name}:{row.line}: {option.flag} is under '{row.heading}'; "
                    f"{table.prog} --help has it under '{section}'"
                )
        if known and not unknown:
            expected = ", ".join(table.default_text(o) for o in known)
            if row.cells[1] != expected:
                drift.append(
                    f"{name}:{row.line}: {', '.join(flags)}: the default is {expected!r} "
                    f"(documented: {row.cells[1]!r})"
                )
    for option in table.options:
        if option.flag not in seen:
            drift.append(
                f"{name}: {option.flag} is not documented; under "
                f"'### {table.section_of(option)}' add:\n    {_flag_row(table, option)}"
            )
    placed = [title for title, _ in table.sections]
    if OTHER_OPTIONS in {table.section_of(o) for o in table.options}:
        drift.append(f"{table.prog}: options in no --help section (declare them in _SECTIONS)")
    headings = [h.replace("`", "") for h in _headings_under(page.read_text(), FLAGS_SECTION)]
    headings = [h for h in headings if h in placed]
    if headings != placed:
        drift.append(f"{name}: the sections are {headings}; --help's are {placed}")
    return drift


def _headings_under(text: str, under: str) -> list[str]:
    found, inside = [], False
    for line in text.splitlines():
        if match := re.match(r"^(#+) (.*)", line):
            if len(match.group(1)) == 2:
                inside = match.group(2).strip() == under
            elif inside:
                found.append(match.group(2).strip())
    return found


# -- metrics -----------------------------------------------------------------------------------

METRIC_CLASSES = {
    "Counter": "counter",
    "CounterMetricFamily": "counter",
    "Gauge": "gauge",
    "GaugeMetricFamily": "gauge",
    "Histogram": "histogram",
    "HistogramMetricFamily": "histogram",
    "Summary": "summary",
    "Metric": "metric",
}
METRIC_NAME = re.compile(r"^(hangup_\w+|vllm:\w+)$")


@dataclass(frozen=True)
class Declared:
    name: str
    """As exported (a counter with ``_total``)."""
    labels: tuple[str, ...] | None
    """None where the declaration does not spell them out."""
    where: str


def declared_metrics(*packages: str) -> dict[str, Declared]:
    """Every metric the code in ``packages`` declares, found in its source: each call of a
    prometheus_client metric class or family whose name is a literal."""
    found: dict[str, Declared] = {}
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                declared = _declaration(
                    node, f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"
                )
                if declared is not None:
                    found[declared.name] = declared
    return found


def _declaration(node: ast.AST, where: str) -> Declared | None:
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    first = node.args[0]
    if not isinstance(first, ast.Constant) or not isinstance(first.value, str):
        return None
    if not METRIC_NAME.match(first.value):
        return None
    if func not in METRIC_CLASSES:  # a helper that makes a family (gauge(name, ...)): its name
        return Declared(first.value, None, where)
    name = first.value
    if METRIC_CLASSES[func] == "counter" and not name.endswith("_total"):
        name += "_total"
    labels_node = next((k.value for k in node.keywords if k.arg in ("labelnames", "labels")), None)
    if labels_node is None and func in ("Counter", "Gauge", "Histogram", "Summary"):
        labels_node = node.args[2] if len(node.args) > 2 else None
    labels: tuple[str, ...] | None = None  # spelled out elsewhere
    if labels_node is None:
        labels = ()
    elif isinstance(labels_node, (ast.List, ast.Tuple)):
        words = [e.value for e in labels_node.elts if isinstance(e, ast.Constant)]
        if len(words) == len(labels_node.elts):
            labels = tuple(map(str, words))
    return Declared(name, labels, where)


def metric_drift(pages: list[Path], declared: dict[str, Declared], prefix: str) -> list[str]:
    """How the Metrics tables of ``pages`` differ from the metrics ``declared`` whose names
    start with ``prefix``: one undocumented, one documented that no code declares, or labels
    that differ from the declaration's."""
    documented: dict[str, tuple[str, Row]] = {}
    drift = []
    for page in pages:
        for row in table_rows(page.read_text()):
            names = [n for n in backticked(row.cells[0]) if n.startswith(prefix)]
            if len(names) == 1 and row.cells[0] == f"`{names[0]}`":
                documented[names[0]] = (_shown(page), row)
    ours = {name: d for name, d in declared.items() if name.startswith(prefix)}
    for name, d in sorted(ours.items()):
        if name not in documented:
            drift.append(f"{name} ({d.where}) is exported but in no Metrics table")
    for name, (page, row) in sorted(documented.items()):
        if name not in ours:
            drift.append(f"{page}:{row.line}: {name} is documented but no code declares it")
            continue
        labels = ours[name].labels
        if labels is not None and len(row.cells) > 2 and name.startswith("hangup_"):
            written = tuple(label.strip() for label in row.cells[1].split(",") if label.strip())
            if set(written) != set(labels):
                drift.append(
                    f"{page}:{row.line}: {name}'s labels are {', '.join(labels) or 'none'} "
                    f"(documented: {row.cells[1] or 'none'})"
                )
    return drift


def named_metrics(text: str) -> set[str]:
    """Every metric name a page writes in backticks, with a sample's suffix taken off."""
    names = set()
    for word in re.findall(r"`([^`]+)`", text):
        for name in re.findall(r"\b(hangup_(?:gateway|proxy)_[a-z_]+)", word):
            names.add(re.sub(r"_(bucket|count|sum)$", "", name))
    return names


# -- chart values -------------------------------------------------------------------------------

VALUES_SECTION = "Values"


def schema_leaves(node: dict[str, Any], path: str = "") -> dict[str, dict[str, Any]]:
    """Every value the schema names, by dotted path; an object with properties is not one
    value but its properties are."""
    props = node.get("properties")
    if not props:
        return {path: node}
    leaves: dict[str, dict[str, Any]] = {}
    for key, child in props.items():
        leaves.update(schema_leaves(child, f"{path}.{key}" if path else key))
    return leaves


def chart_defaults() -> dict[str, Any]:
    return dict(yaml.safe_load((CHART / "values.yaml").read_text()))


def value_default(defaults: dict[str, Any], path: str) -> Any:
    node: Any = defaults
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def render_value(value: Any) -> str:
    """A value's default as the table writes it."""
    if value is None:
        return "`null`"
    return (
        f"`{json.dumps(value, separators=(', ', ': '))}`"
        if not isinstance(value, str)
        else (f'`"{value}"`' if value == "" else f"`{value}`")
    )


def expand_names(cell: str) -> list[str]:
    """``a.b`` / ``.c`` / ``.d`` as ``a.b``, ``a.c``, ``a.d`` (a name starting with a dot
    takes the path of the first full name before it, its last part replaced)."""
    names, base = [], ""
    for name in backticked(cell):
        if name.startswith("."):
            name = base + name
        else:
            base = name.rsplit(".", 1)[0] if "." in name else ""
        names.append(name)
    return names


def values_drift(readme: Path) -> list[str]:
    """How the chart README's Values table differs from ``values.schema.json`` (every value
    named, none that it lacks) and ``values.yaml`` (each value's default)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    leaves = schema_leaves(schema)
    defaults = chart_defaults()
    name = _shown(readme)
    covered: dict[str, int] = {}
    drift = []
    for row in table_rows(readme.read_text(), VALUES_SECTION):
        names = expand_names(row.cells[0])
        expected = []
        for value in names:
            inside = [leaf for leaf in leaves if leaf == value or leaf.startswith(value + ".")]
            if not inside:
                drift.append(f"{name}:{row.line}: {value} is not a value of values.schema.json")
                continue
            for leaf in inside:
                covered.setdefault(leaf, row.line)
            expected.append(render_value(value_default(defaults, value)))
        want = " / ".join(expected)
        if len(expected) == len(names) and row.cells[1] != want:
            drift.append(f"{name}:{row.line}: {', '.join(names)}: the default is {want!r} "
                         f"(documented: {row.cells[1]!r})")  # fmt: skip
    for leaf in leaves:
        if leaf not in covered:
            drift.append(
                f"{name}: {leaf} is not documented; add:\n    | `{leaf}` | "
                f"{render_value(value_default(defaults, leaf))} | "
                f"{leaves[leaf].get('description', '')} |"
            )
    return drift


# -- repository paths -----------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PATH_LIKE = re.compile(r"^\.?[\w-]+(/[\w.*@+-]+)*/?$")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)


def missing_paths(text: str, base: Path) -> list[str]:
    """The repository paths a page names that do not exist: its links (relative to ``base``,
    the page's folder) and every backticked or fenced word that reads as a path starting at a
    top-level folder of the repository (or a folder beside the page), a glob matching nothing
    included; a test name (``::``) or line number after a path is left off."""
    # The repository's own folders: not the hidden ones a run makes (.demo/, .venv*/) but .ci/.
    top = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")} | {".ci"}
    missing = []
    for target in LINK.findall(text):
        path = target.partition("#")[0]
        outside = "://" in target or target.startswith("mailto:")
        if path and not outside and not (base / path).exists():
            missing.append(f"link {target}")
    words = re.findall(r"`([^`\n]+)`", FENCE.sub("", text))
    for block in FENCE.findall(text):
        lines = [line.partition(" #")[0] for line in block.splitlines()]  # not the comments
        words += re.split(r"[\s'\"=(),;]+", "\n".join(lines))
    for word in words:
        path = re.sub(r"(::.*|:\d+(-\d+)?)$", "", word.strip())
        if "/" not in path or not PATH_LIKE.match(path):
            continue
        first = path.removeprefix("./").split("/")[0]
        if first not in top and not (base != REPO and (base / first).is_dir()):
            continue
        if not any(_found(root, path) for root in (REPO, base)):
            missing.append(word.strip())
    return missing


def _found(root: Path, path: str) -> bool:
    if any(c in path for c in "*?"):
        return any(root.glob(path))
    return (root / path).exists()


def main() -> None:
    from gateway_server.config import OPTION_TABLE as GATEWAY
    from proxy.config import OPTION_TABLE as PROXY

    docs = REPO / "docs"
    declared = declared_metrics("proxy", "gateway_server", "hangup_contract")
    pages = [docs / "proxy.md", docs / "gateway.md"]
    drift = [
        *flag_drift(docs / "proxy.md", PROXY),
        *flag_drift(docs / "gateway.md", GATEWAY),
        *metric_drift(pages, declared, "hangup_"),
        *metric_drift([docs / "gateway.md"], declared, "vllm:"),
        *values_drift(CHART / "README.md"),
    ]
    print("\n".join(drift) or "the references match their sources")


if __name__ == "__main__":
    main()
