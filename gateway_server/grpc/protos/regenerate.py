"""Regenerates the checked-in protobuf modules from the ``.proto`` files beside this module.

The generated ``*_pb2.py`` / ``*_pb2.pyi`` files are checked in so that installing hangup needs
no compiler; ``tests/test_grpc_protos.py`` regenerates them into a temporary directory and fails
when the checked-in ones are stale. After editing a ``.proto``::

    python -m gateway_server.grpc.protos.regenerate

Needs ``grpcio-tools`` (a test dependency), imported only when generating.

One change is made to protoc's output: the messages are registered in hangup's own descriptor
pool (:data:`gateway_server.grpc.protos.pool.POOL`) instead of protobuf's process-wide default
pool. The ``inference`` package shares its symbols with Triton's own generated modules, and the
default pool refuses a second definition of a symbol, so without this a process could not hold
both hangup's gateway and ``tritonclient`` (a test harness, a benchmark, an application that
embeds both).
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
# Protos are named relative to the repository root, so the generated modules register as
# gateway_server/grpc/protos/<name>.proto and need no import path tricks.
ROOT = PROTO_DIR.parent.parent.parent
PROTOS = ("inference.proto", "cancellation.proto")


def generated_names() -> list[str]:
    """The files :func:`generate` writes, relative to this directory."""
    return [f"{Path(p).stem}_pb2{suffix}" for p in PROTOS for suffix in (".py", ".pyi")]


_DEFAULT_POOL = "_descriptor_pool.Default().AddSerializedFile("
_PRIVATE_POOL = "_POOL.AddSerializedFile("
_POOL_IMPORT = "from gateway_server.grpc.protos.pool import POOL as _POOL\n"
_INSERT_AFTER = "# @@protoc_insertion_point(imports)\n"


def private_pool(source: str) -> str:
    """protoc's ``*_pb2.py`` text, registering its file in hangup's pool instead of the default.

    Raises ``RuntimeError`` when protoc's output no longer has the expected shape.
    """
    if source.count(_DEFAULT_POOL) != 1 or source.count(_INSERT_AFTER) != 1:
        raise RuntimeError("unexpected protoc output: cannot move it to hangup's descriptor pool")
    source = source.replace(_DEFAULT_POOL, _PRIVATE_POOL)
    return source.replace(_INSERT_AFTER, _INSERT_AFTER + _POOL_IMPORT)


def generate(out_root: Path) -> None:
    """Write the generated modules under ``out_root`` (mirroring the repository layout).

    Raises ``RuntimeError`` with protoc's exit code when compilation fails.
    """
    from grpc_tools import protoc  # type: ignore[import-untyped, unused-ignore]

    out_root.mkdir(parents=True, exist_ok=True)
    sources = [str((PROTO_DIR / p).relative_to(ROOT)) for p in PROTOS]
    include = str(Path(protoc.__file__).parent / "_proto")
    code = protoc.main(
        [
            "protoc",
            f"-I{ROOT}",
            f"-I{include}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            *sources,
        ]
    )
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}")
    out_dir = out_root / PROTO_DIR.relative_to(ROOT)
    for proto in PROTOS:
        module = out_dir / f"{Path(proto).stem}_pb2.py"
        module.write_text(private_pool(module.read_text()))


def main() -> None:
    generate(ROOT)
    print("regenerated:", ", ".join(generated_names()), file=sys.stderr)


if __name__ == "__main__":
    main()
