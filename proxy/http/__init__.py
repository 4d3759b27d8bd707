"""The HTTP/1.1 listener: its socket (``listener``), the server holding every connection
(``server``), each connection's protocol without I/O (``core``, saying ``events``) and its asyncio
glue (``protocol``), the relay of each call (``relay``), the header rules (``headers``), the call
id written into bodies (``tagging``) and metrics scrapes passed through (``scrape``)."""
