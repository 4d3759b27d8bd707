"""Helm's engine from helm-sdkpy, for the chart tests (tests/support/chart.py drives it).

helm-sdkpy (Helm's Go engine in a shared library) needs Python 3.12, so it lives in its own
virtualenv (`.venv-helm`, built by `make helm-engine`) and this file runs there as a script,
printing one JSON object:

    .venv-helm/bin/python tests/support/helm_engine.py lint CHART MERGED_VALUES.json
        {"ok", "messages": [{"severity", "path", "text"}]}
    .venv-helm/bin/python tests/support/helm_engine.py render CHART MERGED_VALUES.json \
        [EXISTING.json]
        {"ok", "error"} or {"ok", "manifest", "hooks", "notes"}
    .venv-helm/bin/python tests/support/helm_engine.py package CHART DEST_DIR
        {"path"}

helm-sdkpy's lint takes no values, so the caller merges the scenario over the chart's values
(what `helm lint -f` does) and this script lints a copy of the chart whose values.yaml is the
result. It has no `template` either: `render` runs its install action against RecordingKubeAPI,
a stand-in API server on loopback (see there). Standard library and helm_sdkpy only.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
import tempfile
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SEVERITY = {0: "unknown", 1: "info", 2: "warning", 3: "error"}


def chart_with_values(chart: Path, values: dict[str, Any], into: Path) -> Path:
    """A copy of ``chart`` (links resolved) whose values.yaml is ``values`` as JSON (valid YAML)."""
    copy = into / chart.name
    shutil.copytree(chart, copy, symlinks=False)
    (copy / "values.yaml").write_text(json.dumps(values, indent=1) + "\n")
    return copy


def lint(chart: Path, values: dict[str, Any]) -> dict[str, Any]:
    import helm_sdkpy

    with tempfile.TemporaryDirectory() as tmp:
        copy = chart_with_values(chart, values, Path(tmp))
        config = helm_sdkpy.Configuration(namespace="default")
        result = asyncio.run(helm_sdkpy.Lint(config).run(str(copy)))
    messages = [
        {
            "severity": SEVERITY.get(m.get("Severity", 0), "unknown"),
            "path": m.get("Path", ""),
            # helm-sdkpy serialises Go errors as {}: the text is lost, the path and severity stay.
            "text": json.dumps(m.get("Err")),
        }
        for m in result.get("Messages") or []
    ]
    return {"ok": not result.get("Errors"), "messages": messages}


# The API groups and kinds the chart may create, as discovery documents list them.
RESOURCES: dict[str, list[tuple[str, str, bool]]] = {
    "v1": [
        ("pods", "Pod", True),
        ("services", "Service", True),
        ("secrets", "Secret", True),
        ("configmaps", "ConfigMap", True),
        ("serviceaccounts", "ServiceAccount", True),
        ("namespaces", "Namespace", False),
    ],
    "apps/v1": [("deployments", "Deployment", True)],
    "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget", True)],
    "autoscaling/v2": [("horizontalpodautoscalers", "HorizontalPodAutoscaler", True)],
    "networking.k8s.io/v1": [("networkpolicies", "NetworkPolicy", True)],
    "monitoring.coreos.com/v1": [
        ("servicemonitors", "ServiceMonitor", True),
        ("podmonitors", "PodMonitor", True),
        ("prometheusrules", "PrometheusRule", True),
    ],
    "inference.networking.k8s.io/v1": [("inferencepools", "InferencePool", True)],
}
OBJECT_PATH = re.compile(
    r"^/(?:api/v1|apis/[^/]+/[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<res>[a-z]+)(?:/(?P<name>[^/]+))?$"
)


def protobuf_fields(data: bytes) -> dict[int, list[bytes | int]]:
    """The top-level fields of one protobuf message (length-delimited and varint ones)."""
    fields: dict[int, list[bytes | int]] = {}
    i = 0

    def varint() -> int:
        nonlocal i
        shift = value = 0
        while True:
            byte = data[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while i < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            fields.setdefault(number, []).append(varint())
        elif wire == 2:
            size = varint()
            fields.setdefault(number, []).append(data[i : i + size])
            i += size
        elif wire == 5:
            i += 4
        elif wire == 1:
            i += 8
        else:
            raise ValueError(f"protobuf wire type {wire}")
    return fields


def object_identity(body: bytes, content_type: str) -> dict[str, Any]:
    """apiVersion, kind and metadata of a JSON or Kubernetes-protobuf encoded object."""
    if "protobuf" not in content_type:
        return dict(json.loads(body))
    # Kubernetes' envelope: b"k8s\0", then Unknown{typeMeta=1{apiVersion=1, kind=2}, raw=2}; every
    # object's field 1 is its ObjectMeta{name=1, generateName=2, namespace=3, ...}.
    envelope = protobuf_fields(body[4:])
    type_meta = protobuf_fields(bytes(envelope[1][0]))  # type: ignore[arg-type]
    meta = protobuf_fields(bytes(protobuf_fields(bytes(envelope[2][0]))[1][0]))  # type: ignore[arg-type]
    text = {k: bytes(v[0]).decode() for k, v in meta.items() if k in (1, 3)}  # type: ignore[arg-type]
    return {
        "apiVersion": bytes(type_meta[1][0]).decode(),  # type: ignore[arg-type]
        "kind": bytes(type_meta[2][0]).decode(),  # type: ignore[arg-type]
        "metadata": {"name": text.get(1, ""), "namespace": text.get(3, "")},
    }


class KubeAPIServer(ThreadingHTTPServer):
    """The stand-in's server; ``store`` maps API paths to the objects held there."""

    def __init__(self, existing: list[dict[str, Any]]) -> None:
        super().__init__(("127.0.0.1", 0), RecordingKubeAPI)
        self.store: dict[str, dict[str, Any]] = {}
        for obj in existing:  # objects "already in the cluster" (what Helm's lookup finds)
            meta = obj["metadata"]
            plural = next(n for n, k, _ in RESOURCES[obj["apiVersion"]] if k == obj["kind"])
            prefix = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
            self.store[f"{prefix}/namespaces/{meta['namespace']}/{plural}/{meta['name']}"] = obj


class RecordingKubeAPI(BaseHTTPRequestHandler):
    """A stand-in Kubernetes API server on loopback, NOT a cluster: it serves discovery for the
    kinds above, stores what it is sent and answers 404 for anything it has not stored. Nothing
    is scheduled, admitted or validated; it only lets Helm's install action run offline so its
    rendered manifest can be read."""

    server: KubeAPIServer

    @property
    def store(self) -> dict[str, dict[str, Any]]:
        return self.server.store

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def discovery(self, path: str) -> Any:
        if path == "/version":
            return {"major": "1", "minor": "31", "gitVersion": "v1.31.0", "platform": "linux/amd64"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if path == "/apis":
            groups = []
            for gv in RESOURCES:
                if "/" in gv:
                    group, version = gv.split("/")
                    entry = {"groupVersion": gv, "version": version}
                    groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        gv = path.removeprefix("/api/").removeprefix("/apis/")
        if gv in RESOURCES:
            verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
            resources = [
                {"name": n, "singularName": k.lower(), "namespaced": ns, "kind": k, "verbs": verbs}
                for n, k, ns in RESOURCES[gv]
            ]
            return {"kind": "APIResourceList", "groupVersion": gv, "resources": resources}
        return None

    def not_found(self) -> None:
        self.reply(
            404,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "NotFound",
                "code": 404,
                "message": "not found",
            },
        )

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        found = self.discovery(path)
        if found is not None:
            self.reply(200, found)
        elif path in self.store:
            self.reply(200, self.store[path])
        elif (match := OBJECT_PATH.match(path)) and not match.group("name"):
            items = [o for k, o in self.store.items() if k.startswith(path + "/")]
            self.reply(200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items})
        else:
            self.not_found()

    def do_POST(self) -> None:
        path = self.path.split("?")[0]
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        body = object_identity(raw, self.headers.get("Content-Type", ""))
        meta = body.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("resourceVersion", "1")
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        self.store[f"{path}/{meta.get('name')}"] = body
        self.reply(201, body)

    def do_PUT(self) -> None:
        path = self.path.split("?")[0]
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        body = object_identity(raw, self.headers.get("Content-Type", ""))
        self.store[path] = body
        self.reply(200, body)

    def do_DELETE(self) -> None:
        path = self.path.split("?")[0]
        if self.store.pop(path, None) is None:
            self.not_found()
        else:
            self.reply(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})


def render(
    chart: Path, values: dict[str, Any], existing: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Helm's install action against a RecordingKubeAPI: the release's manifest, hooks, notes."""
    server = KubeAPIServer(existing or [])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    kubeconfig = f"""apiVersion: v1
kind: Config
clusters: [{{name: stub, cluster: {{server: "http://{host}:{port}"}}}}]
users: [{{name: stub, user: {{token: stub}}}}]
contexts: [{{name: stub, context: {{cluster: stub, user: stub, namespace: default}}}}]
current-context: stub
"""
    import helm_sdkpy

    try:
        config = helm_sdkpy.Configuration(namespace="default", kubeconfig=kubeconfig)
        release = asyncio.run(
            helm_sdkpy.Install(config).run("rel", str(chart), values=values, wait=False, timeout=60)
        )
    except helm_sdkpy.HelmError as exc:
        return {"ok": False, "error": str(exc)}
    finally:
        server.shutdown()
        server.server_close()
    return {
        "ok": True,
        "manifest": release.get("manifest", ""),
        "hooks": [h.get("manifest", "") for h in release.get("hooks") or []],
        "notes": (release.get("info") or {}).get("notes", ""),
    }


def package(chart: Path, dest: Path) -> dict[str, Any]:
    """`helm package`: the chart archive's path."""
    import helm_sdkpy

    config = helm_sdkpy.Configuration(namespace="default")
    return {"path": asyncio.run(helm_sdkpy.Package(config).run(str(chart), str(dest)))}


def main(argv: list[str]) -> int:
    command, chart, arg = argv[1], Path(argv[2]), argv[3]
    if command == "package":
        print(json.dumps(package(chart, Path(arg))))
        return 0
    values = json.loads(Path(arg).read_text())
    if command == "lint":
        print(json.dumps(lint(chart, values)))
        return 0
    if command == "render":
        existing = json.loads(Path(argv[4]).read_text()) if len(argv) > 4 else []
        print(json.dumps(render(chart, values, existing)))
        return 0
    print(f"unknown command {command!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
