"""The gateway's HTTP API on aiohttp: one module per API (``openai``, ``kserve``, ``cancel``),
shared request plumbing in ``common``, assembly and middleware in ``app``."""
