"""hangup's model gateway: engine workers behind the OpenAI and KServe v2 / Triton APIs.

How it fits together (one request, start to end):

    HTTP / gRPC handler ──▶ CallRegistry.open(call id)  (409 if in flight, rejected if tombstoned)
          │                         │
          ▼                         ▼
    GenerationService.generate ──▶ Engine.generate(engine request)  ──▶ token chunks
          ▲
    cancel API / client disconnect / shutdown ──▶ Call.cancel(reason) ──▶ Engine.abort

The vocabulary (reasons, phases, outcomes) lives in :mod:`gateway_server.vocabulary`; it is the
only source of metric label values, log fields and status mappings.
"""

__version__ = "0.1.0"
