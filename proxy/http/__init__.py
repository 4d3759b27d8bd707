"""The HTTP/1.1 listener: its socket and server (``listener``), the relay of each call
(``relay``), the header rules (``headers``), the call id written into bodies (``tagging``) and
what aiohttp's server logs (``logs``)."""
