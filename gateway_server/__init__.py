"""hangup's model gateway: engine workers behind the OpenAI and KServe v2 / Triton APIs.

How it fits together (one request, start to end):

    HTTP / gRPC handler ──▶ CallRegistry.open(call id)  (409 if in flight, rejected if tombstoned)
          │                         │
          ▼                         ▼
    GenerationService.generate ──▶ Engine.generate(engine request)  ──▶ token chunks
          ▲
    cancel API / client disconnect / shutdown ──▶ Call.cancel(reason) ──▶ Engine.abort

The label values (outcomes, protocols, refusals; the contract's reasons and phases) live in
:mod:`gateway_server.labels` and :mod:`hangup_contract.cancel_labels`; they are the
only source of metric label values, log fields and status mappings.
"""

__version__ = "0.1.0"
