"""The simulated engine's tool handling: none (it reads no tool calls in its answers)."""

from __future__ import annotations

from typing import Any

from gateway_server.engine.base import RequestRejected


class NoTools:
    """The simulation reads no tool calls: a request that names tools is refused by field."""

    def plan(self, body: dict[str, Any]) -> None:
        if body.get("tools") is None and body.get("tool_choice") in (None, "none"):
            return None
        name = "tools" if body.get("tools") is not None else "tool_choice"
        raise RequestRejected(f"'{name}' is not supported by the simulated engine", param=name)
