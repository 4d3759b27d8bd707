"""Explicit cancel calls: the Protocols (``protocols``: ``CancelAdapter``, ``SendsNow``,
``TagsRequests``, ``CancelCall``), the ``Canceller`` that drives the adapters (``canceller``),
the adapters (``http``: one POST on a client of its own, and hangup's call; ``servers``: vLLM's
and SGLang's; ``grpc``: ``hangup.v1.Cancellation``), which one a configuration picks
(``choice``), the calls that get none: OpenAI Responses that outlive their client
(``responses``), and the admin routes of each adapter's server, which clients never reach
(``admin_routes``)."""
