"""The simulated engine's fault switch: ``POST /v2/admin/workers/{worker}/fault`` with
``{"fault": "kill" | "hang" | "resume"}`` (see ``gateway_server.engine.sim.engine``).

Served only when the gateway runs with ``--sim-faults`` (and ``--engine sim``), behind the cancel
API's bearer token: it exists so tests and demos can make an engine die or hang and watch the
gateway bring it back, never for clients. With ``--api-processes``, a worker is reached through
the API process that runs it (404 from the others).
"""

from __future__ import annotations

from aiohttp import web

from gateway_server.http.cancel import check_token
from gateway_server.http.common import SERVICE, read_json_object
from gateway_server.service import GenerationService

ROUTE = "/v2/admin/workers/{worker}/fault"


def add_routes(app: web.Application) -> None:
    app.router.add_post(ROUTE, inject)


async def inject(request: web.Request) -> web.Response:
    """200 ``{"worker", "fault"}`` once applied; 400 for an unknown fault, 404 for a worker not
    run by this process."""
    check_token(request)
    service: GenerationService = request.app[SERVICE]
    fault = str((await read_json_object(request)).get("fault"))
    index = service.inject_fault(request.match_info["worker"], fault)
    return web.json_response({"worker": index, "fault": fault})
