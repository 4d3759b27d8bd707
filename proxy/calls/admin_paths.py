"""Which calls are refused as admin paths of the server behind (``proxy.cancel.admin_routes``),
and which an operator opened (``--allow-admin-path``). No I/O: a target in, a refusal out.

A request is refused when any form a server could route it as matches a route. The forms, from
the target as sent (its query dropped, lower-cased):

- percent-decoded, then split on ``/`` (and ``\\``), as uvicorn and Starlette route it (vLLM,
  SGLang, Truss): ``/%61bort_requests`` is ``/abort_requests``, ``/abort_requests%2F`` is
  ``/abort_requests/``; decoded again while a ``%`` escape is left (at most three times), in
  case a hop in between decodes too;
- when the target holds an escape, also split first and each segment decoded, as a server that
  routes the raw path sees it (Triton: ``/v2/models/a%2Fb/trace/setting`` has a model ``a/b``).

In both, empty and ``.`` segments are dropped, ``..`` takes the one before it, and a segment's
``;parameters`` are cut: ``//abort_requests``, ``/abort_requests/``, ``/x/../abort_requests``,
``/abort_requests;x`` and ``/ABORT_REQUESTS`` are all ``/abort_requests``. That is more than any
of these servers routes (none of them folds case, collapses slashes or cuts parameters); a path
refused that the server would have answered 404 costs nobody anything.

The routes are a tree of segments (``*`` one segment, ``**`` the rest), walked once per form,
linear in the target's length (1.5-2.6 µs for a usual path here). What each path got is
kept (``_KNOWN`` paths per protocol, each at most ``_KNOWN_LENGTH`` characters: 256 KiB at
most; the first ones seen, never replaced), so a call on a path seen before costs one dictionary
lookup (0.1-0.3 µs): a client filling it with paths of its own only sends everyone else back to the
walk.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote

from proxy.cancel.admin_routes import AdminRoutes, Rule

_DECODES = 3  # rounds of percent-decoding at most: each is linear, and three cover any hop
_KNOWN = 512  # paths whose answer is kept
_KNOWN_LENGTH = 256  # ... each at most this long


@dataclass(frozen=True, slots=True)
class Refusal:
    """A call refused: the ``rule`` and the route (``pattern``) it matched."""

    rule: Rule
    pattern: str

    def message(self, target: str) -> str:
        shown = target if len(target) <= 200 else target[:200] + "..."
        return (
            f"{shown!r} is {self.rule.what} (rule {self.rule.name}, route {self.pattern}): "
            f"the sidecar does not relay it from clients; an operator opens it with "
            f"--allow-admin-path {self.pattern}"
        )


_OPENED = Rule("opened", "opened by --allow-admin-path")


class _Node:
    __slots__ = ("children", "here", "rest")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.here: Refusal | None = None  # a route ends at this node
        self.rest: Refusal | None = None  # a route ends with ``**`` here


def _decoded(text: str) -> str:
    for _ in range(_DECODES):
        if "%" not in text:
            break
        text = unquote(text, errors="surrogateescape")
    return text


def _segments(parts: Iterable[str]) -> list[str]:
    kept: list[str] = []
    for part in parts:
        segment = part.partition(";")[0]
        if segment == ".." and kept:
            kept.pop()
        elif segment not in ("", ".", ".."):
            kept.append(segment)
    return kept


def forms(target: str) -> list[list[str]]:
    """The segments a server could route ``target`` (path and query, as sent) as."""
    path = target.partition("?")[0].lower()
    if "%" not in path and "\\" not in path:
        return [_segments(path.split("/"))]
    decoded = _decoded(path).replace("\\", "/")
    return [
        _segments(decoded.split("/")),
        _segments(_decoded(part) for part in path.replace("\\", "/").split("/")),
    ]


class _Tree:
    """Routes as a tree of segments."""

    def __init__(self, routes: Iterable[tuple[str, Rule]]) -> None:
        self.root = _Node()
        for pattern, rule in routes:
            node = self.root
            segments = _segments(pattern.lower().split("/"))
            rest = segments[-1:] == ["**"]
            for segment in segments[:-1] if rest else segments:
                node = node.children.setdefault(segment, _Node())
            refusal = Refusal(rule, pattern)
            if rest and node.rest is None:
                node.rest = refusal
            elif not rest and node.here is None:
                node.here = refusal

    def match(self, segments: list[str]) -> Refusal | None:
        return _walk(self.root, segments, 0)


def _walk(node: _Node, segments: list[str], at: int) -> Refusal | None:
    while True:
        if node.rest is not None:
            return node.rest
        if at == len(segments):
            return node.here
        exact = node.children.get(segments[at])
        star = node.children.get("*")
        if exact is not None and star is not None:  # both may lead to a route
            return _walk(exact, segments, at + 1) or _walk(star, segments, at + 1)
        following = exact or star
        if following is None:
            return None
        node, at = following, at + 1


class AdminGuard:
    """The admin routes of the server behind, less those an operator opened.

    ``opened``: paths from ``--allow-admin-path``, each a route as docs/security.md lists it
    (``/v2/repository/**``), a part of one (``/v2/repository/models/*/load``), or one path
    (``/v2/repository/models/simple/load``), matched as the routes are. Raises ``ValueError``
    naming one that is no admin route here: a typo would otherwise leave the path refused with
    no word said.
    """

    def __init__(self, routes: AdminRoutes, opened: Iterable[str] = ()) -> None:
        self._http = _Tree(routes.http)
        self._grpc = _Tree(routes.grpc)
        self._known_http: dict[str, Refusal | None] = {}
        self._known_grpc: dict[str, Refusal | None] = {}
        opened = tuple(opened)
        for path in opened:
            segments = forms(path)[0]
            if self._http.match(segments) is None and self._grpc.match(segments) is None:
                raise ValueError(f"{path!r} is not an admin route of the server behind")
        self._opened = _Tree((path, _OPENED) for path in opened) if opened else None

    def http(self, target: str) -> Refusal | None:
        """Why an HTTP request for ``target`` (path and query, as sent) is refused, or None."""
        path = target.partition("?")[0]
        known = self._known_http
        return known[path] if path in known else self._answer(self._http, known, path)

    def grpc(self, method: str) -> Refusal | None:
        """Why a gRPC call of ``method`` (``/package.Service/Method``) is refused, or None."""
        known = self._known_grpc
        return known[method] if method in known else self._answer(self._grpc, known, method)

    def _answer(self, tree: _Tree, known: dict[str, Refusal | None], path: str) -> Refusal | None:
        refusal = self._refused(tree, path)
        if len(known) < _KNOWN and len(path) <= _KNOWN_LENGTH:
            known[path] = refusal
        return refusal

    def _refused(self, tree: _Tree, path: str) -> Refusal | None:
        for segments in forms(path):
            refusal = tree.match(segments)
            if refusal is not None and (self._opened is None or not self._opened.match(segments)):
                return refusal
        return None
