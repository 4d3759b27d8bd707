"""The chart's pod, run by `podman kube play`: the closest to a cluster this machine allows.

The chart is rendered by Helm's engine as the deploy tests render it; what podman 4.3 (Debian
bookworm's) cannot take as Kubernetes would is changed in the rendered objects, never in the chart,
and each change is named here:

- Every containerPort gets ``hostIP: 127.0.0.1`` and a free ``hostPort``: podman publishes each
  containerPort on the host, on every address and at the container's own number, where Kubernetes
  publishes none. The pod keeps its own network namespace (slirp4netns); its containers share its
  127.0.0.1, as in a cluster.
- A Secret's ``data`` values are given to podman decoded: podman 4.3 writes a ``data`` value into
  the mounted file as it stands, without decoding its base64 (and ignores ``stringData``).
- A secret volume gets ``optional: false`` (Kubernetes' default): podman 4.3 dereferences the
  field unset and panics.
- What `podman kube down` leaves of a Secret (its podman secret, and the volume made of it) is
  removed after, and before a play: the next play would mount the old volume's token.
- The probes are run by the test as the kubelet runs them (``Pod.probe``): podman turns only the
  liveness probe into a healthcheck, as a shell line (the exec probe's Python splits into words),
  an httpGet on a named port into ``curl`` on port 0 (the image has no curl), and its healthcheck
  timers need systemd.
- The shutdown is run by the test as the kubelet runs it (``Pod.terminate``): each container's
  preStop hook, then SIGTERM, then SIGKILL at the pod's grace period; podman runs no preStop hook
  and gives every container 10 s.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import json
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.base.addresses import free_port


def for_podman(objects: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The rendered objects podman plays (Secret, ConfigMap, Deployment), changed as the module
    says; and each named container port's host port on 127.0.0.1."""
    played = [o for o in objects if o["kind"] in ("Secret", "ConfigMap", "Deployment")]
    host_ports: dict[str, int] = {}
    for secret in (o for o in played if o["kind"] == "Secret"):
        secret["data"] = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    for deployment in (o for o in played if o["kind"] == "Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        for container in spec["containers"]:
            for port in container.get("ports", []):
                port["hostIP"] = "127.0.0.1"
                port["hostPort"] = host_ports.setdefault(port["name"], free_port())
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                volume["secret"].setdefault("optional", False)
    return played, host_ports


@dataclass
class Pod:
    podman: str
    name: str
    spec: dict[str, Any]  # the Deployment's pod template spec
    host_ports: dict[str, int]
    secrets: dict[str, dict[str, str]]  # Secret name -> key -> decoded value
    manifest: Path
    terminated: dict[str, float] = field(default_factory=dict)  # container -> seconds to exit

    def container(self, name: str) -> dict[str, Any]:
        return next(c for c in self.spec["containers"] if c["name"] == name)

    def container_id(self, name: str) -> str:
        return f"{self.name}-{name}"

    def url(self, port_name: str) -> str:
        return f"http://127.0.0.1:{self.host_ports[port_name]}"

    def podman_run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.podman, *argv], capture_output=True, text=True, timeout=timeout, check=False
        )

    def inspect(self, container: str) -> dict[str, Any]:
        done = self.podman_run("container", "inspect", self.container_id(container))
        assert done.returncode == 0, done.stderr
        found: list[dict[str, Any]] = json.loads(done.stdout)
        return found[0]

    def logs(self, container: str) -> str:
        done = self.podman_run("logs", self.container_id(container))
        return done.stdout + done.stderr

    def probe(self, container: str, kind: str) -> tuple[bool, str]:
        """One try of a container's probe (``startupProbe``, ``livenessProbe``,
        ``readinessProbe``) as the kubelet makes it: (passed, what it saw)."""
        spec = self.container(container)[kind]
        timeout = float(spec.get("timeoutSeconds", 1))
        if "exec" in spec:
            try:
                done = self.podman_run(
                    "exec", self.container_id(container), *spec["exec"]["command"],
                    timeout=timeout + 5,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                return False, f"exec timed out after {timeout + 5} s"
            return done.returncode == 0, f"exit {done.returncode} {done.stderr.strip()}"
        if "httpGet" in spec:
            get = spec["httpGet"]
            port = get["port"]
            host_port = self.host_ports[port] if isinstance(port, str) else port
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{host_port}{get['path']}", timeout=timeout
                ) as resp:
                    status = int(resp.status)
            except urllib.error.HTTPError as exc:
                status = exc.code
            except OSError as exc:
                return False, repr(exc)
            return 200 <= status < 400, f"HTTP {status}"
        raise AssertionError(f"{container}'s {kind}: a kind of probe this test does not run")

    def terminate(self) -> None:
        """The kubelet's shutdown of the pod: for each container at once, its preStop hook, then
        SIGTERM, then SIGKILL when the pod's grace period is spent. Records how long each took."""
        grace = float(self.spec.get("terminationGracePeriodSeconds", 30))
        start = time.monotonic()

        def stop(container: dict[str, Any]) -> None:
            name = container["name"]
            pre_stop = container.get("lifecycle", {}).get("preStop", {})
            if "exec" in pre_stop:
                self.podman_run(
                    "exec", self.container_id(name), *pre_stop["exec"]["command"],
                    timeout=grace + 5,
                )  # fmt: skip
            left = max(0, round(grace - (time.monotonic() - start)))
            stop_argv = ("stop", "--time", str(left), self.container_id(name))
            self.podman_run(*stop_argv, timeout=grace + 30)
            self.terminated[name] = time.monotonic() - start

        with concurrent.futures.ThreadPoolExecutor(len(self.spec["containers"])) as pool:
            list(pool.map(stop, self.spec["containers"]))

    def exit_code(self, container: str) -> int:
        return int(self.inspect(container)["State"]["ExitCode"])


def forget_secrets(podman: str, names: dict[str, Any]) -> None:
    """Remove what podman keeps of each Secret: the secret, and the volume it made of it for
    the pod (`kube down` leaves that volume, and the next play would mount its old contents)."""
    for name in names:
        subprocess.run([podman, "secret", "rm", name], capture_output=True, check=False)
        subprocess.run([podman, "volume", "rm", "--force", name], capture_output=True, check=False)


@contextlib.contextmanager
def played_pod(podman: str, objects: list[dict[str, Any]]) -> Iterator[Pod]:
    """`podman kube play` of the rendered objects (``for_podman``), `podman kube down` after."""
    played, host_ports = for_podman(objects)
    deployment = next(o for o in played if o["kind"] == "Deployment")
    secrets = {o["metadata"]["name"]: dict(o["data"]) for o in played if o["kind"] == "Secret"}
    with tempfile.TemporaryDirectory(prefix="hangup-pod-") as tmp:
        manifest = Path(tmp) / "pod.yaml"
        manifest.write_text(yaml.safe_dump_all(played))
        down = [podman, "kube", "down", str(manifest)]
        subprocess.run(down, capture_output=True, timeout=120, check=False)  # a run cut short
        forget_secrets(podman, secrets)
        play = subprocess.run(
            [podman, "kube", "play", "--network", "slirp4netns", str(manifest)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        try:
            assert play.returncode == 0, f"podman kube play: {play.stdout}{play.stderr}"
            yield Pod(
                podman,
                f"{deployment['metadata']['name']}-pod-0",
                deployment["spec"]["template"]["spec"],
                host_ports,
                secrets,
                manifest,
            )
        finally:
            subprocess.run(down, capture_output=True, timeout=120, check=False)
            forget_secrets(podman, secrets)
