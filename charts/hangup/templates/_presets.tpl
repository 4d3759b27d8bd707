{{/* What each `server` preset sets, in one place: `hangup.preset` is a YAML map every template
     reads with `include "hangup.preset" . | fromYaml`.

     adapter      the proxy's --cancel-adapter (proxy.cancelAdapter overrides it)
     container    the server container's name
     command      the server's command (modelServer.command overrides it); args: its flags,
                  after modelServer.args (so the address and ports hold)
     env          the server's environment before modelServer.env
     loopback     whether the server listens on 127.0.0.1 only (false: the NetworkPolicy is
                  always rendered, so that only the sidecar's ports admit anyone)
     live, ready  paths of its liveness and readiness, asked inside its container
     metricsPort  a port of its own for /metrics (Triton); else it is scraped through the proxy
     metricsPath  where it serves /metrics (Truss mounts its exporter at /metrics/)
     shm          whether it gets a memory-backed /dev/shm
     test         what `helm test` calls (kind: openai | triton | truss) and what it reads from
                  the server's /metrics (inflight: gauges; counter: counters)
     rows         the dashboard's rows shown (the hundreds of their panels' ids: 1 the sidecar,
                  2 hangup's gateway, 3 vLLM, 4 Triton) */}}
{{- define "hangup.preset" -}}
{{- $m := .Values.modelServer -}}
{{- $s := .Values.server -}}
{{- if eq $s "gateway" }}
adapter: hangup
container: gateway
loopback: true
test:
  kind: openai
  inflight: [hangup_gateway_inflight_requests]
  counter: ['hangup_gateway_cancellations_total{reason="client_disconnect"}']
rows: [1, 2]
{{- else if eq $s "vllm-serve" }}
adapter: vllm
container: vllm
command: [vllm, serve]
args: [--host=127.0.0.1, --port={{ $m.httpPort }}]
loopback: true
live: /health
ready: /health
shm: true
test:
  kind: openai
  inflight: ["vllm:num_requests_running", "vllm:num_requests_waiting"]
  counter: []
rows: [1, 3]
{{- else if eq $s "triton" }}
adapter: triton
container: triton
command: [tritonserver]
args:
  - --http-address=127.0.0.1
  - --http-port={{ $m.httpPort }}
  - --grpc-address=127.0.0.1
  - --grpc-port={{ $m.grpcPort }}
  - --allow-metrics=true
  - --metrics-address=0.0.0.0
  - --metrics-port={{ $m.metricsPort }}
  - --exit-timeout-secs={{ $m.drainTimeoutSeconds }}
loopback: true
live: /v2/health/live
ready: /v2/health/ready
metricsPort: {{ $m.metricsPort }}
shm: true
test:
  kind: triton
  inflight: []
  counter: []
rows: [1, 4]
{{- else if eq $s "truss" }}
adapter: none
container: truss
env:
  - name: INFERENCE_SERVER_PORT
    value: {{ $m.httpPort | quote }}
loopback: false
live: /
ready: /v1/models/model
metricsPath: /metrics/
test:
  kind: truss
  inflight: []
  counter: []
rows: [1]
{{- else if eq $s "sglang" }}
adapter: sglang
container: sglang
command: [python3, -m, sglang.launch_server]
args: [--host=127.0.0.1, --port={{ $m.httpPort }}, --enable-metrics]
loopback: true
live: /health
ready: /health
shm: true
test:
  kind: openai
  inflight: []
  counter: []
rows: [1]
{{- else }}
adapter: {{ .Values.proxy.cancelAdapter | quote }}
container: {{ dig "name" "" $m.container | quote }}
loopback: true
test:
  kind: openai
  inflight: []
  counter: []
rows: [1, 2, 3, 4]
{{- end }}
{{- end }}

{{/* The path the server's metrics are read on (metrics.upstream.path, else the preset's). */}}
{{- define "hangup.metricsPath" -}}
{{- .Values.metrics.upstream.path | default (include "hangup.preset" . | fromYaml).metricsPath | default "/metrics" }}
{{- end }}

{{- define "hangup.adapter" -}}
{{- .Values.proxy.cancelAdapter | default (include "hangup.preset" . | fromYaml).adapter }}
{{- end }}

{{/* Whether a container of the chart's (or a patch of the user's Deployment) runs the server:
     not for an edge (custom, no container), nor with the gateway. */}}
{{- define "hangup.presetServer" -}}
{{- if has .Values.server (list "vllm-serve" "triton" "truss" "sglang") }}true{{ end }}
{{- end }}
