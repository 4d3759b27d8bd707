"""The checked-in protobuf modules are current, and hangup's KServe v2 proto is wire-compatible
with the one Triton's clients are generated from.

hangup's schema is read from a descriptor set that protoc writes from the ``.proto`` (the source
of truth), Triton's from ``tritonclient``'s generated modules.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from grpc_tools import protoc

from hangup_contract.protos import regenerate

# Lines that name the protoc / protobuf versions: they differ between machines, not schemas.
_VERSION_LINE = re.compile(r"^# Protobuf Python Version: .*$", re.MULTILINE)
_VERSION_CHECK = re.compile(
    r"^_runtime_version\.ValidateProtobufRuntimeVersion\(.*?^\)$", re.MULTILINE | re.DOTALL
)


def _normalized(text: str) -> str:
    return _VERSION_CHECK.sub("", _VERSION_LINE.sub("", text))


def test_checked_in_modules_match_a_fresh_generation(tmp_path: Path) -> None:
    regenerate.generate(tmp_path)
    for proto in regenerate.PROTOS:
        for name in proto.generated():
            fresh = (tmp_path / name).read_text()
            checked_in = (regenerate.ROOT / name).read_text()
            assert _normalized(checked_in) == _normalized(fresh), (
                f"{name} is stale: run `python -m hangup_contract.protos.regenerate`"
            )


@pytest.fixture(scope="module")
def hangup_inference(
    tmp_path_factory: pytest.TempPathFactory,
) -> descriptor_pb2.FileDescriptorProto:
    out = tmp_path_factory.mktemp("descriptors") / "inference.pb"
    source = "hangup_contract/protos/inference.proto"
    code = protoc.main(["protoc", f"-I{regenerate.ROOT}", f"--descriptor_set_out={out}", source])
    assert code == 0
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (proto,) = files.file
    return proto


def _messages(
    protos: list[descriptor_pb2.DescriptorProto], prefix: str
) -> dict[str, descriptor_pb2.DescriptorProto]:
    found: dict[str, descriptor_pb2.DescriptorProto] = {}
    for message in protos:
        name = f"{prefix}.{message.name}"
        found[name] = message
        found.update(_messages(list(message.nested_type), name))
    return found


def _triton_message(full_name: str) -> Descriptor:
    from tritonclient.grpc import model_config_pb2, service_pb2

    for module in (service_pb2, model_config_pb2):
        pool = module.DESCRIPTOR.pool
        try:
            return pool.FindMessageTypeByName(full_name)
        except KeyError:
            continue
    raise AssertionError(f"tritonclient has no message {full_name}")


def test_every_message_field_matches_triton(
    hangup_inference: descriptor_pb2.FileDescriptorProto,
) -> None:
    messages = _messages(list(hangup_inference.message_type), hangup_inference.package)
    assert "inference.ModelInferRequest.InferInputTensor" in messages
    for full_name, message in messages.items():
        theirs = _triton_message(full_name)
        for field in message.field:
            other: FieldDescriptor | None = theirs.fields_by_name.get(field.name)
            assert other is not None, f"{full_name}.{field.name} is not in Triton's protocol"
            assert other.number == field.number, f"{full_name}.{field.name}: field number"
            assert other.type == field.type, f"{full_name}.{field.name}: type"
            assert other.is_repeated == (
                field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
            ), f"{full_name}.{field.name}: repeated"
            if field.type_name:
                referenced = (other.message_type or other.enum_type).full_name
                assert field.type_name == f".{referenced}", f"{full_name}.{field.name}: type name"


def test_enum_values_match_triton(hangup_inference: descriptor_pb2.FileDescriptorProto) -> None:
    from tritonclient.grpc import model_config_pb2

    (data_type,) = (e for e in hangup_inference.enum_type if e.name == "DataType")
    theirs = model_config_pb2.DESCRIPTOR.enum_types_by_name["DataType"]
    assert {v.name: v.number for v in data_type.value} == {v.name: v.number for v in theirs.values}


def test_service_methods_match_triton(hangup_inference: descriptor_pb2.FileDescriptorProto) -> None:
    from tritonclient.grpc import service_pb2

    (service,) = hangup_inference.service
    assert f"{hangup_inference.package}.{service.name}" == "inference.GRPCInferenceService"
    theirs = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert {m.name for m in service.method} >= {
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelConfig",
        "ModelInfer",
        "ModelStreamInfer",
        "RepositoryIndex",
    }
    for method in service.method:
        other = theirs.methods_by_name[method.name]
        assert method.input_type == f".{other.input_type.full_name}"
        assert method.output_type == f".{other.output_type.full_name}"
        assert method.client_streaming == other.client_streaming
        assert method.server_streaming == other.server_streaming
