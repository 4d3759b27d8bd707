"""The stream's hand-built responses against protobuf's own deterministic encoding, byte for byte
(no I/O); its plain encoding orders a map by a hash seeded per process."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from gateway_server.grpc.responses import TextResponses, varint
from gateway_server.grpc.stream import CANCEL_ID
from gateway_server.grpc.tensors import text_response
from gateway_server.requests import FINAL_FLAG
from hangup_contract.protos import inference_pb2 as pb

_texts = st.none() | st.text(max_size=300)
_names = st.text(max_size=200)
_extra = st.sampled_from([{}, {CANCEL_ID: "c" * 32 + ":r"}]) | st.dictionaries(
    st.text(min_size=1, max_size=40).filter(lambda key: key != FINAL_FLAG),
    st.text(max_size=150) | st.booleans() | st.integers(-(2**63), 2**63 - 1),
    max_size=3,
)


def _by_protobuf(
    model: str, version: str, request_id: str, text: str | None, final: bool, extra: dict
) -> pb.ModelStreamInferResponse:
    response = text_response(model, version, request_id, text, {FINAL_FLAG: final, **extra})
    return pb.ModelStreamInferResponse(infer_response=response)


@given(_names, st.sampled_from(["", "1", "12"]), _names, _texts, st.booleans(), _extra)
@example("", "", "", None, False, {"t": ""})  # a key the flag's name extends: upb writes it after
def test_responses_are_protobufs_bytes(
    model: str, version: str, request_id: str, text: str | None, final: bool, extra: dict
) -> None:
    responses = TextResponses(model, version, request_id, FINAL_FLAG, extra)
    built = responses.encode(None if text is None else text.encode(), final)
    message = _by_protobuf(model, version, request_id, text, final, extra)
    assert pb.ModelStreamInferResponse.FromString(built) == message
    assert built == message.SerializeToString(deterministic=True)
    assert len(built) <= responses.overhead + len((text or "").encode())


def test_the_gateways_own_shapes_byte_for_byte() -> None:
    """The responses a stream writes: with and without the cancel alias, data and empty final."""
    for extra in ({}, {CANCEL_ID: "0123456789abcdef0123456789abcdef:req-1"}):
        responses = TextResponses("hangup-sim", "1", "req-1", FINAL_FLAG, extra)
        for text, final in ((" token", False), ("é€😀", True), ("", True), (None, True)):
            message = _by_protobuf("hangup-sim", "1", "req-1", text, final, extra)
            data = None if text is None else text.encode()
            assert responses.encode(data, final) == message.SerializeToString(deterministic=True)


def test_varint() -> None:
    expected = [b"\x00", b"\x01", b"\x7f", b"\x80\x01", b"\xac\x02", b"\xff" * 9 + b"\x01"]
    assert [varint(n) for n in (0, 1, 127, 128, 300, 2**64 - 1)] == expected
