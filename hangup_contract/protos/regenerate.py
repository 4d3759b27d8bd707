"""Regenerates hangup's checked-in protobuf modules from their ``.proto`` files.

The generated ``*_pb2.py`` / ``*_pb2.pyi`` files are checked in so that installing hangup needs
no compiler; ``tests/pure/test_grpc_protos.py`` regenerates them into a temporary directory and
fails when the checked-in ones are stale. After editing a ``.proto``::

    python -m hangup_contract.protos.regenerate

Needs ``grpcio-tools`` (a test dependency), imported only when generating. One tool for every
proto in the tree, all beside this module: the cancel API's and KServe v2 / Triton's
``inference.proto``.

One change is made to protoc's output for ``inference.proto``: its messages register in
hangup's own descriptor pool (``hangup_contract.protos.pool.POOL``) instead of protobuf's
process-wide default pool. The ``inference`` package shares its symbols with Triton's own
generated modules, and the default pool refuses a second definition of a symbol, so without this
a process could not hold both hangup (its gateway, or its proxy's Triton bridge) and
``tritonclient`` (a test harness, a benchmark, an application that embeds both).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
"""The repository root: protos are named relative to it, so generated modules need no import
path tricks (``hangup_contract/protos/cancellation.proto`` → ``hangup_contract.protos``)."""


@dataclass(frozen=True)
class Proto:
    path: str
    """Relative to the repository root."""
    pool: str | None = None
    """The module whose ``POOL`` the generated messages register in; None: the default pool."""

    def generated(self) -> list[str]:
        """The generated files, relative to the repository root."""
        stem = str(Path(self.path).with_suffix(""))
        return [f"{stem}_pb2.py", f"{stem}_pb2.pyi"]


PROTOS = (
    Proto("hangup_contract/protos/cancellation.proto"),
    Proto("hangup_contract/protos/inference.proto", pool="hangup_contract.protos.pool"),
)

_DEFAULT_POOL = "_descriptor_pool.Default().AddSerializedFile("
_PRIVATE_POOL = "_POOL.AddSerializedFile("
_INSERT_AFTER = "# @@protoc_insertion_point(imports)\n"


def private_pool(source: str, pool_module: str) -> str:
    """protoc's ``*_pb2.py`` text, registering its file in ``pool_module.POOL`` instead of the
    default pool. Raises ``RuntimeError`` when protoc's output no longer has the expected shape.
    """
    if source.count(_DEFAULT_POOL) != 1 or source.count(_INSERT_AFTER) != 1:
        raise RuntimeError("unexpected protoc output: cannot move it to a private descriptor pool")
    source = source.replace(_DEFAULT_POOL, _PRIVATE_POOL)
    pool_import = f"from {pool_module} import POOL as _POOL\n"
    return source.replace(_INSERT_AFTER, _INSERT_AFTER + pool_import)


def generate(out_root: Path) -> None:
    """Write every generated module under ``out_root`` (mirroring the repository layout).

    Raises ``RuntimeError`` with protoc's exit code when compilation fails.
    """
    from grpc_tools import protoc  # type: ignore[import-untyped, unused-ignore]

    out_root.mkdir(parents=True, exist_ok=True)
    include = str(Path(protoc.__file__).parent / "_proto")
    code = protoc.main(
        ["protoc", f"-I{ROOT}", f"-I{include}", f"--python_out={out_root}",
         f"--pyi_out={out_root}", *(p.path for p in PROTOS)]
    )  # fmt: skip
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}")
    for proto in PROTOS:
        if proto.pool is not None:
            module = out_root / proto.generated()[0]
            module.write_text(private_pool(module.read_text(), proto.pool))


def main() -> None:
    generate(ROOT)
    print("regenerated:", ", ".join(f for p in PROTOS for f in p.generated()), file=sys.stderr)


if __name__ == "__main__":
    main()
