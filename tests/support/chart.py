"""Driving Helm's engine over the chart from the test suite (Python 3.11).

A `helm` binary on PATH is used as it is (`helm lint -f`, `helm install --dry-run=client`);
otherwise helm-sdkpy's engine in `.venv-helm`, through tests/support/helm_engine.py (it needs Python
3.12). Either way the tests see the same shapes: a lint verdict with its messages, and a release
with its manifest, hooks and notes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.base.processes import REPO
from bench.harness.unavailable import Unavailable

CHART = REPO / "charts" / "hangup"
HELM_VENV_PYTHON = REPO / ".venv-helm" / "bin" / "python"
ENGINE_SCRIPT = REPO / "tests" / "support" / "helm_engine.py"


def merge(base: Any, over: Any) -> Any:
    """Helm's value coalescing: maps merge key by key, anything else is replaced, null deletes."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = merge(base.get(key), value)
        return out
    return over


def scenario(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((CHART / "ci" / name).read_text()) or {})


def scenarios() -> list[str]:
    return sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))


@dataclass
class Lint:
    ok: bool
    messages: list[dict[str, str]]

    def problems(self) -> list[dict[str, str]]:
        return [m for m in self.messages if m["severity"] in ("warning", "error")]


@dataclass
class Release:
    ok: bool
    error: str = ""
    manifest: str = ""
    hooks: list[str] = field(default_factory=list)
    notes: str = ""

    def objects(self) -> list[dict[str, Any]]:
        return [o for o in yaml.safe_load_all(self.manifest) if o]

    def hook_objects(self) -> list[dict[str, Any]]:
        return [o for h in self.hooks for o in yaml.safe_load_all(h) if o]

    def find(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects() if o["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.find(kind)
        assert len(found) == 1, f"expected one {kind}, found {len(found)}"
        return found[0]


class HelmEngine:
    """Lint and render the chart with a values overlay, through whichever Helm engine is here."""

    def __init__(self) -> None:
        self.helm = shutil.which("helm")
        if self.helm is None and not HELM_VENV_PYTHON.exists():
            raise Unavailable("no `helm` on PATH and no .venv-helm: run `make k8s-tools`")

    @property
    def name(self) -> str:
        return self.helm or "helm-sdkpy (.venv-helm)"

    def lint(self, values: dict[str, Any]) -> Lint:
        with tempfile.TemporaryDirectory() as tmp:
            if self.helm:
                vals = Path(tmp) / "values.yaml"
                vals.write_text(yaml.safe_dump(values))
                done = self._run([self.helm, "lint", str(CHART), "-f", str(vals)], check=False)
                return Lint(
                    done.returncode == 0,
                    [
                        {
                            "severity": "error" if "[ERROR]" in line else "warning",
                            "path": "",
                            "text": line,
                        }
                        for line in done.stdout.splitlines()
                        if line.startswith(("[ERROR]", "[WARNING]"))
                    ],
                )
            out = self._sdk("lint", values, Path(tmp))
            return Lint(out["ok"], out["messages"])

    def render(
        self, values: dict[str, Any], existing: list[dict[str, Any]] | None = None
    ) -> Release:
        """Install into nothing: the release Helm would create. ``existing`` objects are what
        Helm's `lookup` finds (helm-sdkpy only: a `helm` binary's dry run looks nothing up)."""
        with tempfile.TemporaryDirectory() as tmp:
            if self.helm:
                vals = Path(tmp) / "values.yaml"
                vals.write_text(yaml.safe_dump(values))
                done = self._run(
                    [
                        self.helm,
                        "install",
                        "rel",
                        str(CHART),
                        "--dry-run=client",
                        "-o",
                        "json",
                        "-f",
                        str(vals),
                    ],
                    check=False,
                )
                if done.returncode:
                    return Release(False, error=done.stderr)
                rel = json.loads(done.stdout)
                return Release(
                    True,
                    manifest=rel["manifest"],
                    hooks=[h["manifest"] for h in rel.get("hooks", [])],
                    notes=rel["info"].get("notes", ""),
                )
            extra = Path(tmp) / "existing.json"
            extra.write_text(json.dumps(existing or []))
            out = self._sdk("render", values, Path(tmp), extra)
            return Release(
                out["ok"],
                out.get("error", ""),
                out.get("manifest", ""),
                out.get("hooks", []),
                out.get("notes", ""),
            )

    def package(self, dest: Path) -> Path:
        """`helm package` the chart into ``dest``; the archive's path."""
        if self.helm:
            done = self._run([self.helm, "package", str(CHART), "-d", str(dest)])
            return Path(done.stdout.strip().rsplit(" ", 1)[-1])
        argv = [str(HELM_VENV_PYTHON), str(ENGINE_SCRIPT), "package", str(CHART), str(dest)]
        return Path(json.loads(self._run(argv).stdout)["path"])

    def _sdk(self, command: str, values: dict[str, Any], tmp: Path, *extra: Path) -> dict[str, Any]:
        merged = merge(yaml.safe_load((CHART / "values.yaml").read_text()), values)
        vals = tmp / "values.json"
        vals.write_text(json.dumps(merged))
        done = self._run(
            [str(HELM_VENV_PYTHON), str(ENGINE_SCRIPT), command, str(CHART), str(vals)]
            + [str(e) for e in extra]
        )
        return dict(json.loads(done.stdout))

    @staticmethod
    def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
        if check and done.returncode:
            raise RuntimeError(f"{argv[:3]} exited {done.returncode}:\n{done.stderr[-4000:]}")
        return done
