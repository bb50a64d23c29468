"""Objects as the apiserver returns them: Node, Service and Status."""

from __future__ import annotations

from typing import Any

from aiohttp import web

CREATED = "2026-11-22T04:00:00Z"


def make_node(
    name: str,
    labels: dict[str, str] | None = None,
    *,
    internal_ips: list[str] | None = None,
    extra_addresses: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A Node object as the apiserver returns it (metadata, spec, status.addresses)."""
    addresses = [{"type": "InternalIP", "address": ip} for ip in internal_ips or []]
    addresses += extra_addresses or []
    addresses.append({"type": "Hostname", "address": name})
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "labels": dict(labels or {}), "uid": f"uid-{name}"},
        "spec": {"podCIDR": "10.244.0.0/24"},
        "status": {
            "addresses": addresses,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def make_service(namespace: str, name: str, cluster_ips: list[str] | None) -> dict[str, Any]:
    """A ClusterIP Service; ``cluster_ips`` ``["None"]`` is headless, None leaves it unset."""
    spec: dict[str, Any] = {
        "type": "ClusterIP",
        "ports": [{"name": "proxy", "protocol": "TCP", "port": 10264, "targetPort": 10264}],
    }
    if cluster_ips is not None:
        spec["clusterIP"] = cluster_ips[0]
        spec["clusterIPs"] = cluster_ips
        families = ["IPv6" if ":" in ip else "IPv4" for ip in cluster_ips if ip != "None"]
        spec["ipFamilies"] = families or ["IPv4"]
    return {
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "creationTimestamp": CREATED,
        },
        "spec": spec,
        "status": {"loadBalancer": {}},
    }


def status(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    """A failure ``Status`` object (the body of every API error, and of ERROR watch events)."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def status_response(code: int, reason: str, message: str, **details: Any) -> web.Response:
    return web.json_response(status(code, reason, message, **details), status=code)
