"""Does a hang-up get through the front doors users run to hangup's sidecar, and how fast?

``matrix``: nginx, HAProxy, Caddy and Envoy with the configurations in ``docs/front-doors/``,
per stage of a call; ``litellm_edge``: three pods behind LiteLLM (which does not pass a hang-up
on) and an edge proxy whose cancel finds the pod."""
