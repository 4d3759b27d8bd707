# hangup, CPU image: the proxy and the gateway with the simulated engine (no vLLM, no GPU).
#   docker build -t hangup:0.1.0 .        (or: make image)
#   docker run --rm hangup:0.1.0 hangup-gateway --help
# Both commands are on PATH: the Helm chart runs `hangup-gateway` and `hangup-proxy` from this one
# image. The base is pinned by exact tag (no digest: none could be looked up where this was written).

FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/hangup
COPY pyproject.toml README.md* ./
COPY hangup_contract ./hangup_contract
COPY gateway_server ./gateway_server
COPY proxy ./proxy
RUN /opt/hangup/bin/pip install --no-cache-dir . \
    && /opt/hangup/bin/pip uninstall --yes pip setuptools wheel

FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="hangup" \
      org.opencontainers.image.description="Cancelling sidecar proxy and model gateway (simulated engine)" \
      org.opencontainers.image.licenses="Apache-2.0"
# The demos run from /app: `docker run --rm hangup:0.1.0 python -m bench.demos.proxy`.
# The code stays root-owned; only the demo's log directory is writable.
RUN groupadd --system --gid 10001 hangup \
    && useradd --system --uid 10001 --gid hangup --home-dir /home/hangup --create-home hangup \
    && install -d -o 10001 -g 10001 /app/.demo
COPY --from=build /opt/hangup /opt/hangup
WORKDIR /app
# The demos and what they import, nothing else of bench/ (tests/tooling/test_demo_ships_alone.py).
COPY bench/__init__.py ./bench/__init__.py
COPY bench/base ./bench/base
COPY bench/demos ./bench/demos
ENV PATH=/opt/hangup/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 8080 8081 9090
CMD ["hangup-proxy", "--help"]
