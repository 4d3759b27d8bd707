"""Which cancel adapter each protocol's calls are cancelled with (``--cancel-adapter``).

- ``hangup``: HTTP ``POST /v2/requests/{id}/cancel`` (the contract); gRPC
  ``hangup.v1.Cancellation/Cancel``.
- ``vllm``: close the stream (vLLM aborts on disconnect); with ``--vllm-abort-endpoint`` also
  ``POST /abort_requests``, a Responses call's id written into its body first
  (``proxy.cancel.servers``).
- ``sglang``: the id in the body's ``rid``, then ``POST /abort_request``.
- ``triton``: close the stream; HTTP ``infer``, ``generate`` and ``generate_stream`` are carried
  to Triton over gRPC so that closing it is a cancellation (``proxy.triton``).
- ``none``: close the stream.

In front of any server but hangup's gateway a gRPC hang-up closes the upstream stream.
Cancel calls go to ``--cancel-url`` (default ``--upstream-http``), or with ``hangup`` to every
member of ``--cancel-pool`` at once (``proxy.cancel.pool``), with ``--cancel-token-file``'s token
as a bearer token.
"""

from __future__ import annotations

from collections.abc import Callable

from proxy.cancel.grpc import GrpcCancelAdapter
from proxy.cancel.http import HangupCancel, HttpCancelAdapter
from proxy.cancel.pool import PoolCancelAdapter
from proxy.cancel.protocols import CancelAdapter, CancelCall, NoCancelAdapter, TagsRequests
from proxy.cancel.servers import SglangAbort, VllmAbort
from proxy.config import AdapterName, Config


def open_http_adapter(
    config: Config, pool_asked: Callable[[int], None] = lambda members: None
) -> CancelAdapter:
    """The adapter the HTTP listener's calls are cancelled with (``pool_asked`` is told how many
    members each cancel asked, with ``--cancel-pool``)."""
    if config.cancel_pool:
        return PoolCancelAdapter(
            config.cancel_pool,
            config.cancel_token,
            config.cancel_attempt_timeout,
            refresh=config.cancel_pool_refresh,
            max_members=config.cancel_pool_max,
            asked=pool_asked,
        )
    call = _http_call(config)
    if call is None:
        return NoCancelAdapter(config.cancel_adapter.value)
    return HttpCancelAdapter(
        call, config.cancel_base_url, config.cancel_token, config.cancel_attempt_timeout
    )


def _http_call(config: Config) -> CancelCall | None:
    name = config.cancel_adapter
    if name is AdapterName.HANGUP:
        return HangupCancel()
    if name is AdapterName.SGLANG:
        return SglangAbort()
    if name is AdapterName.VLLM and config.vllm_abort_endpoint:
        return VllmAbort()
    return None


def body_tagger(adapter: CancelAdapter) -> TagsRequests | None:
    """What writes a call's id into the request body, when ``adapter``'s upstream reads it there."""
    hooks = adapter.call if isinstance(adapter, HttpCancelAdapter) else adapter
    return hooks if isinstance(hooks, TagsRequests) else None


def open_grpc_adapter(config: Config) -> CancelAdapter:
    """The adapter the gRPC listener's calls are cancelled with: only hangup's gateway has a
    gRPC cancel; in front of any other server a hang-up closes the upstream stream."""
    if config.cancel_adapter is AdapterName.HANGUP:
        return GrpcCancelAdapter(
            config.upstream_grpc, config.cancel_token, config.cancel_attempt_timeout
        )
    return NoCancelAdapter(config.cancel_adapter.value)
