"""Explicit cancel calls: the ``Canceller`` and the adapter seam (``canceller``), the adapters
(``http``: hangup's HTTP call and what every one-POST adapter shares; ``servers``: vLLM and
SGLang; ``grpc``: ``hangup.v1.Cancellation``), and which adapter a configuration picks
(``choice``)."""
