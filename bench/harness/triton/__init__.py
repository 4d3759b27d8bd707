"""A real Triton for the Triton tier and its benchmarks, and the models it serves: ``server``
starts ``tritonserver`` on a copy of a model repository (``models/``: the project's
python-backend models, and ``record.py``, which each copies beside it), ``vllm`` the same with
vLLM's ``AsyncLLM`` inside (``vllm_models/``), ``io`` talks to the KServe v2 gRPC side with
Triton's own client.

The models are run by Triton's python backend, never imported here: ``models/`` and
``vllm_models/`` are data (mypy leaves them out; ruff reads them).
"""
