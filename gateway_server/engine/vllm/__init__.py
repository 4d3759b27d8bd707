"""The vLLM engine: one ``AsyncLLM`` per worker (see :mod:`.engine`).

Nothing is imported here: vLLM's engine cores load :mod:`.kv_connector` and the plugin in
:mod:`.amx` by name, in processes that need nothing else of the gateway."""
