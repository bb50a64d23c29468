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


def make_endpoint_slice(
    namespace: str,
    service: str,
    endpoints: list[tuple[str, str]],
    *,
    port_name: str = "metrics",
    port: int = 9400,
    suffix: str = "abcde",
    ready: bool = True,
) -> dict[str, Any]:
    """An EndpointSlice of ``service``: ``endpoints`` is [(node name, pod IP)], as the
    EndpointSlice controller writes it for a DaemonSet's pods."""
    return {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": f"{service}-{suffix}",
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
            "uid": f"uid-{namespace}-{service}-{suffix}",
            "creationTimestamp": CREATED,
        },
        "addressType": "IPv4",
        "endpoints": [
            {
                "addresses": [ip],
                "conditions": {"ready": ready, "serving": ready, "terminating": False},
                "nodeName": node,
                "targetRef": {"kind": "Pod", "namespace": namespace, "name": f"{service}-{node}"},
            }
            for node, ip in endpoints
        ],
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
    }


def make_exporter_service(
    namespace: str,
    name: str,
    *,
    port: int = 9400,
    target: int | str = 9400,
    port_name: str = "metrics",
) -> dict[str, Any]:
    """A ClusterIP Service like upstream dcgm-exporter's chart creates."""
    svc = make_service(namespace, name, ["10.96.7.7"])
    svc["spec"]["ports"] = [
        {"name": port_name, "protocol": "TCP", "port": port, "targetPort": target}
    ]
    return svc


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
