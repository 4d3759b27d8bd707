"""What reaches a real Triton's model when a client hangs up, and does a hang-up through hangup's
Triton bridge free vLLM running inside Triton?

``hangup``: direct, through the proxy relaying HTTP, and through the bridge (and the bridge's
price per call); ``with_vllm``: vLLM's ``AsyncLLM`` inside Triton, per stage of a request."""
