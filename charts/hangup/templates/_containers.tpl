{{/* The pod's containers: the gateway (or the user's model server) and the proxy sidecar. */}}

{{- define "hangup.gatewayProbe" -}}
exec:
  command:
    - python3
    - -c
    - "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:{{ .port }}{{ .path }}', timeout=2).status != 200)"
{{- with .probe }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "hangup.gatewayContainer" -}}
{{- $g := .Values.gateway -}}
- name: gateway
  image: {{ include "hangup.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: [hangup-gateway]
  args:
    - --host=127.0.0.1
    - --http-port={{ $g.httpPort }}
    - --grpc-port={{ $g.grpcPort }}
    - --engine={{ $g.engine }}
    {{- with $g.model }}
    - --model={{ . }}
    {{- end }}
    {{- with $g.servedModelName }}
    - --served-model-name={{ . }}
    {{- end }}
    - --workers={{ $g.workers }}
    {{- if gt (int $g.apiProcesses) (int $g.workers) }}
    {{- fail (printf "gateway.apiProcesses=%d is more than gateway.workers=%d: each API process runs its own engine workers" (int $g.apiProcesses) (int $g.workers)) }}
    {{- end }}
    - --api-processes={{ $g.apiProcesses }}
    {{- if gt (int $g.apiProcesses) 1 }}
    - --grpc-process-ports={{ $g.grpcProcessPorts }}
    {{- end }}
    {{- with $g.workerRoles }}
    - --worker-roles={{ . }}
    {{- end }}
    - --cancel-token-file={{ include "hangup.tokenPath" . }}
    - --drain-timeout={{ $g.drainTimeoutSeconds }}
    - --engine-down-limit={{ $g.engineDownLimitSeconds }}
    - --loop-stall-limit={{ $g.loopStallLimitSeconds }}
    - --responses-max-stored={{ $g.responses.maxStored }}
    - --responses-background-per-client={{ $g.responses.backgroundPerClient }}
    - --responses-stored-per-client={{ $g.responses.storedPerClient }}
    # Fair shares (docs/security.md): a call's client is whom the proxy saw, the address it
    # appends to X-Forwarded-For (gRPC: x-forwarded-for; every connection to the gateway comes
    # from the proxy).
    - --client-header=x-forwarded-for
    - --responses-ttl={{ $g.responses.ttlSeconds }}
    {{- with $g.extraArgs }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  env:
    # The root filesystem is read-only: caches (Hugging Face, vLLM, Triton) go to /tmp.
    - name: HOME
      value: /tmp
    - name: HF_HOME
      value: /tmp/huggingface
    {{- with $g.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  # No ports: the gateway listens on 127.0.0.1 and only the proxy beside it reaches it.
  startupProbe:
    {{- include "hangup.gatewayProbe" (dict "port" $g.httpPort "path" "/v2/health/live" "probe" $g.startupProbe) | nindent 4 }}
  livenessProbe:
    {{- include "hangup.gatewayProbe" (dict "port" $g.httpPort "path" "/v2/health/live" "probe" $g.livenessProbe) | nindent 4 }}
  readinessProbe:
    {{- include "hangup.gatewayProbe" (dict "port" $g.httpPort "path" "/v2/health/ready" "probe" $g.readinessProbe) | nindent 4 }}
  lifecycle:
    preStop:
      # Keep serving while the proxy drains and sends its shutdown cancels.
      exec:
        command: [sleep, "{{ include "hangup.upstreamPreStopSeconds" . }}"]
  {{- $resources := deepCopy ($g.resources | default dict) }}
  {{- if gt (int $g.gpu.count) 0 }}
  {{- $limits := get $resources "limits" | default dict }}
  {{- $_ := set $limits $g.gpu.resourceName (int $g.gpu.count) }}
  {{- $_ := set $resources "limits" $limits }}
  {{- end }}
  {{- with $resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: cancel-token
      mountPath: /var/run/hangup/cancel-token
      readOnly: true
    - name: gateway-tmp
      mountPath: /tmp
    {{- if gt (int $g.gpu.count) 0 }}
    - name: gateway-shm
      mountPath: /dev/shm
    {{- end }}
    {{- with $g.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/* The server's preStop: keep serving while the proxy drains and sends its shutdown cancels. */}}
{{- define "hangup.serverPreStop" -}}
{{- dict "preStop" (dict "exec" (dict "command" (list "sleep" (include "hangup.upstreamPreStopSeconds" .)))) | toYaml }}
{{- end }}

{{/* A preset's server container (vllm-serve, triton, truss, sglang): see _presets.tpl. */}}
{{- define "hangup.presetContainer" -}}
{{- $m := .Values.modelServer -}}
{{- $p := include "hangup.preset" . | fromYaml -}}
{{- $c := dict "name" $p.container "image" $m.image "imagePullPolicy" .Values.image.pullPolicy -}}
{{- with ($m.command | default $p.command) }}
{{- $_ := set $c "command" . }}
{{- end }}
{{- with concat $m.args ($p.args | default list) }}
{{- $_ := set $c "args" . }}
{{- end }}
{{- $env := list (dict "name" "HOME" "value" "/tmp") (dict "name" "HF_HOME" "value" "/tmp/huggingface") }}
{{- $env = concat $env ($p.env | default list) $m.env (dig "env" list $m.container) }}
{{- $_ := set $c "env" $env }}
{{- with $p.metricsPort }}
{{- $_ := set $c "ports" (list (dict "name" "server-metrics" "containerPort" (int .) "protocol" "TCP")) }}
{{- end }}
{{- $live := include "hangup.gatewayProbe" (dict "port" $m.httpPort "path" $p.live "probe" (dict "periodSeconds" 10 "failureThreshold" 3 "timeoutSeconds" 3)) | fromYaml }}
{{- $ready := include "hangup.gatewayProbe" (dict "port" $m.httpPort "path" $p.ready "probe" (dict "periodSeconds" 5 "failureThreshold" 2 "timeoutSeconds" 3)) | fromYaml }}
{{- $startup := include "hangup.gatewayProbe" (dict "port" $m.httpPort "path" $p.live "probe" $m.startupProbe) | fromYaml }}
{{- $_ := set $c "startupProbe" $startup }}
{{- $_ := set $c "livenessProbe" $live }}
{{- $_ := set $c "readinessProbe" $ready }}
{{- $_ := set $c "lifecycle" (include "hangup.serverPreStop" . | fromYaml) }}
{{- $_ := set $c "securityContext" (deepCopy .Values.securityContext) }}
{{- $mounts := list (dict "name" "server-tmp" "mountPath" "/tmp") }}
{{- if and $p.shm $m.shmSize }}
{{- $mounts = append $mounts (dict "name" "server-shm" "mountPath" "/dev/shm") }}
{{- end }}
{{- if $m.mountCancelToken }}
{{- $mounts = append $mounts (dict "name" "cancel-token" "mountPath" "/var/run/hangup/cancel-token" "readOnly" true) }}
{{- end }}
{{- $_ := set $c "volumeMounts" (concat $mounts (dig "volumeMounts" list $m.container)) }}
{{- $c = mergeOverwrite $c (omit (deepCopy $m.container) "env" "volumeMounts") }}
{{- toYaml (list $c) }}
{{- end }}

{{/* server: custom: the container as written, with the preStop unless it has a lifecycle. */}}
{{- define "hangup.modelServerContainer" -}}
{{- $c := deepCopy .Values.modelServer.container -}}
{{- if not (hasKey $c "lifecycle") }}
{{- $_ := set $c "lifecycle" (include "hangup.serverPreStop" . | fromYaml) }}
{{- end }}
{{- if .Values.modelServer.mountCancelToken }}
{{- $mounts := get $c "volumeMounts" | default list }}
{{- $mounts = append $mounts (dict "name" "cancel-token" "mountPath" "/var/run/hangup/cancel-token" "readOnly" true) }}
{{- $_ := set $c "volumeMounts" $mounts }}
{{- end }}
{{- toYaml (list $c) }}
{{- end }}

{{- define "hangup.proxyContainer" -}}
{{- $p := .Values.proxy -}}
{{- $upstreamGrpc := include "hangup.upstreamGrpc" . -}}
- name: proxy
  image: {{ include "hangup.proxyImage" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if $p.nativeSidecar }}
  # A native sidecar: started, and ready, before the server; stopped after it.
  restartPolicy: Always
  {{- end }}
  command: [hangup-proxy]
  args:
    - --host=0.0.0.0
    - --http-port={{ $p.httpPort }}
    - --grpc-port={{ $p.grpcPort }}
    - --admin-port={{ $p.adminPort }}
    - --upstream-http={{ include "hangup.upstreamHttp" . }}
    {{- with $upstreamGrpc }}
    - --upstream-grpc={{ . }}
    {{- end }}
    - --cancel-adapter={{ include "hangup.adapter" . }}
    {{- if $p.vllmAbortEndpoint }}
    - --vllm-abort-endpoint
    {{- end }}
    {{- if $p.trustClientRequestId }}
    - --trust-client-request-id
    {{- end }}
    {{- with $p.cancelPool }}
    - --cancel-pool={{ join "," . }}
    {{- end }}
    {{- if ne (include "hangup.metricsPath" .) "/metrics" }}
    # The server's metrics path, relayed as a scrape (not a call).
    - --scrape-paths=/metrics,/metrics/pool,{{ include "hangup.metricsPath" . }}
    {{- end }}
    {{- if include "hangup.tokenEnabled" . }}
    - --cancel-token-file={{ include "hangup.tokenPath" . }}
    {{- end }}
    - --cancel-deadline={{ $p.cancelDeadlineSeconds }}
    - --drain-timeout={{ $p.drainTimeoutSeconds }}
    - --workers={{ include "hangup.proxyWorkers" . }}
    {{- with $p.extraArgs }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $p.env }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    - name: http
      containerPort: {{ $p.httpPort }}
      protocol: TCP
    {{- if $upstreamGrpc }}
    - name: grpc
      containerPort: {{ $p.grpcPort }}
      protocol: TCP
    {{- end }}
    - name: admin
      containerPort: {{ $p.adminPort }}
      protocol: TCP
  {{- if $p.nativeSidecar }}
  # The server starts once this passes.
  startupProbe:
    httpGet:
      path: /readyz
      port: admin
    periodSeconds: 1
    failureThreshold: 60
  {{- end }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: admin
    {{- toYaml $p.livenessProbe | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: admin
    {{- toYaml $p.readinessProbe | nindent 4 }}
  {{- if not $p.nativeSidecar }}
  lifecycle:
    preStop:
      # Let the Service drop this pod before the proxy stops taking new calls.
      exec:
        command: [sleep, "{{ .Values.shutdown.preStopSeconds }}"]
  {{- end }}
  {{- with $p.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    {{- if include "hangup.tokenEnabled" . }}
    - name: cancel-token
      mountPath: /var/run/hangup/cancel-token
      readOnly: true
    {{- end }}
    - name: proxy-tmp
      mountPath: /tmp
{{- end }}
