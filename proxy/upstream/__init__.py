"""The relay's HTTP/1.1 client: keep-alive connections to the upstream (``client``)."""
