"""The OpenAI API's language: which fields each endpoint honours (:mod:`.fields`), a request
read by them (:mod:`.request`), structured output, tools, log-probabilities, several choices
side by side, and the Responses API (:mod:`.responses`). No I/O: the HTTP adapter
(``gateway_server.http``) carries it."""
