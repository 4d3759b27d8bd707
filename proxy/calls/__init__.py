"""A relayed call, whatever its protocol: what the listeners share about each call they relay.

- :mod:`.request_ids`: the call's ids: the one sent upstream (fresh, or the client's when
  trusted), which every cancel call names, and the client's own.
- :mod:`.state`: the call (:class:`~proxy.calls.state.Call`, filled in as it goes, logged once)
  and the calls in flight with the draining flag (``ServerState``, one per process): each
  listener admits a call, names the task that handles it, and releases it when it is done.
- :mod:`.lifecycle`: how a call ends, the same for HTTP and gRPC: stop (record why, submit the
  cancel to the ``Canceller``), close the upstream once the cancel is answered or after the
  grace, finish (count and log once).
- :mod:`.held`: the calls by id, the ids recently finished and the tombstones: what the proxy's
  own cancel by id finds in this process; :mod:`.siblings`: with ``--workers``, the same
  question asked of the other workers over Unix sockets.
- :mod:`.admin_paths`: whether a call names an admin route of the server behind
  (``proxy.cancel.admin_routes``), matched as the server would route it, and refused before it
  is a call at all.

The package sits below the listeners (``http``, ``grpc``, ``triton``, ``admin``), the server and
the supervisor, and above the cancel path (``cancel``), to which a stopped call's cancel goes.
"""
