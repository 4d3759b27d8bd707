"""Run Truss's own model server (``main.py`` of a laid-out server directory, the image's
``/app``) on 127.0.0.1 and a port of the kernel's choosing: Truss binds ``0.0.0.0`` and
``$INFERENCE_SERVER_PORT``, hard-coded, so uvicorn is handed a socket bound here instead.
Writes ``{"http": "127.0.0.1:PORT"}`` to the file named by its one argument once bound (the
model may still be loading: the caller waits for ``/v1/models/model`` to answer 200).

Run by ``.venv-truss``'s interpreter in the server's directory
(``bench/harness/truss/server.py``)."""

from __future__ import annotations

import json
import os
import runpy
import socket
import sys
from typing import Any

import uvicorn

listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", 0))
_serve = uvicorn.Server.serve


async def serve_on_loopback(self: uvicorn.Server, sockets: Any = None) -> None:
    await _serve(self, sockets=[listener])


uvicorn.Server.serve = serve_on_loopback  # type: ignore[method-assign]
ready = sys.argv[1]
with open(ready + ".tmp", "w") as out:
    json.dump({"http": f"127.0.0.1:{listener.getsockname()[1]}"}, out)
os.replace(ready + ".tmp", ready)
sys.path.insert(0, os.getcwd())
runpy.run_path("main.py", run_name="__main__")
