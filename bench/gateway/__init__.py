"""What does the gateway cost per stream and per cancel, and does its API serve from more than
one process?

``cancel``: cancel → abort at 1, 100 and 1000 streams (simulated engine); ``api_processes``: one
and two API processes side by side (and ``vllm serve`` beside them); ``front_aiperf``: the API
front's CPU per token against ``vllm serve``, driven by AIPerf."""
