"""The contract between hangup's proxy and its gateway: what each side says to the other.

Both processes import this package; it imports neither of them. Everything here is interface:
changing a value changes what crosses the wire between the two, or what dashboards, alerts and
other servers' adapters read.

- :mod:`.cancel_labels`: why a request was cancelled (``Reason``), where it was (``Phase``), and
  what a cancel found (``CancelState``); their values are wire values and metric labels.
- :mod:`.request_id`: the ``X-Request-Id`` header (``x-request-id`` metadata on gRPC) that names
  every upstream call, the one rule for an id, and fresh ids.
- :mod:`.cancel`: the cancel call over HTTP, ``POST /v2/requests/{id}/cancel``: its path, its
  JSON body and its JSON answer, encoded and parsed in one place.
- :mod:`.jobs`: a job's calls cancelled at once (a group: ``X-Hangup-Group``), a batch of ids,
  vLLM PR 55521's paths, and the answer both sides give them.
- :mod:`.protos`: ``hangup.v1.Cancellation/Cancel``, the same call over gRPC
  (``cancellation.proto`` and the module generated from it).

No I/O anywhere in the package: values in, values out.
"""
