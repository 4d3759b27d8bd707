"""The HTTP/1.1 listener: its socket (``listener``), the server that parses and answers each
connection (``protocol``), the relay of each call (``relay``), the header rules (``headers``), the
call id written into bodies (``tagging``) and metrics scrapes passed through (``scrape``)."""
