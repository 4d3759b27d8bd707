"""Which cancel adapter each protocol's calls are cancelled with (``--cancel-adapter``).

- ``hangup``: HTTP ``POST /v2/requests/{id}/cancel`` (the contract); gRPC
  ``hangup.v1.Cancellation/Cancel``.
- ``vllm``: close the stream (vLLM aborts on disconnect); with ``--vllm-abort-endpoint`` also
  ``POST /abort_requests`` (``proxy.cancel.servers``).
- ``sglang``: the id in the body's ``rid``, then ``POST /abort_request``.
- ``none``: close the stream.

In front of any server but hangup's gateway a gRPC hang-up closes the upstream stream.
Cancel calls go to ``--cancel-url`` (default ``--upstream-http``) with ``--cancel-token-file``'s
token as a bearer token.
"""

from __future__ import annotations

from proxy.cancel.canceller import CancelAdapter, NoCancelAdapter
from proxy.cancel.grpc import GrpcCancelAdapter
from proxy.cancel.http import HangupCancelAdapter
from proxy.cancel.servers import SglangAbortAdapter, VllmAbortAdapter
from proxy.config import AdapterName, Config


def open_http_adapter(config: Config) -> CancelAdapter:
    """The adapter the HTTP listener's calls are cancelled with."""
    name = config.cancel_adapter
    args = (config.cancel_base_url, config.cancel_token, config.cancel_attempt_timeout)
    if name is AdapterName.HANGUP:
        return HangupCancelAdapter(*args)
    if name is AdapterName.SGLANG:
        return SglangAbortAdapter(*args)
    if name is AdapterName.VLLM and config.vllm_abort_endpoint:
        return VllmAbortAdapter(*args)
    return NoCancelAdapter(name.value)


def open_grpc_adapter(config: Config) -> CancelAdapter:
    """The adapter the gRPC listener's calls are cancelled with: only hangup's gateway has a
    gRPC cancel; in front of any other server a hang-up closes the upstream stream."""
    if config.cancel_adapter is AdapterName.HANGUP:
        return GrpcCancelAdapter(
            config.upstream_grpc, config.cancel_token, config.cancel_attempt_timeout
        )
    return NoCancelAdapter(config.cancel_adapter.value)
