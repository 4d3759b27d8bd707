"""Does cancellation hold on a disaggregated (prefill/decode) gateway on real vLLM, and what does
P/D cost against aggregated serving here?

``cancel`` is the benchmark (AIPerf cancelling through the proxy, Dynamo's head-of-line test, P/D
against aggregated); ``stack`` what it runs against, ``hol`` its plain-client measurements,
``report`` its arithmetic and tables."""
