"""A kubeconfig file for the Kubernetes tests (the fake API server is tests/helpers/fakekube)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path


def write_kubeconfig(
    folder: Path, cluster: Mapping[str, object], user: Mapping[str, object] | None = None
) -> str:
    """``folder/kubeconfig`` with cluster ``c`` and user ``u`` (default: a bearer token), the
    current context ``main`` on them, and a context ``other`` naming a cluster that is not
    there; returns its path."""
    path = folder / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "main",
                "clusters": [{"name": "c", "cluster": dict(cluster)}],
                "users": [{"name": "u", "user": {"token": "t0ken"} if user is None else user}],
                "contexts": [
                    {"name": "main", "context": {"cluster": "c", "user": "u"}},
                    {"name": "other", "context": {"cluster": "missing", "user": "u"}},
                ],
            }
        )
    )
    return str(path)
