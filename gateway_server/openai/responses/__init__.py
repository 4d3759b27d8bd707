"""OpenAI's Responses API (``/v1/responses``) on the gateway.

- :mod:`.request`: the field table and the reader: a Responses body becomes the chat request
  it is (instructions, earlier turns and input as messages) and goes through the chat path's
  reader (:mod:`gateway_server.openai.request`): one prompt, one set of sampling parameters.
- :mod:`.objects`: the response object and the typed stream events, without I/O.
- :mod:`.store`: responses in flight and stored ones, bounded by count and age.
- :mod:`gateway_server.http.responses`: the routes, and how each kind of response runs.

A response id is ``resp_`` followed by the id of the call that generates it, so
``POST /v1/responses/{resp id}/cancel`` and ``POST /v2/requests/{call id}/cancel`` reach the
same call (docs/openai.md, "The Responses API").
"""
