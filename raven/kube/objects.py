"""Kubernetes objects as untrusted JSON: every accessor checks types and raises
:class:`KubeObjectError` with a short reason, never anything else."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raven.protocol.names import node_name_error, normalize_node_name

#: Longest object excerpt quoted in a log line about a garbage object.
EXCERPT_CHARS = 200


class KubeObjectError(ValueError):
    """An object (or watch event) is not usable; the message says why."""


def excerpt(obj: object) -> str:
    """A short JSON rendering of ``obj`` for a log line."""
    try:
        text = json.dumps(obj, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(obj)
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "..."


def as_mapping(obj: object, what: str) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise KubeObjectError(f"{what} is not a JSON object")
    return obj


def metadata(obj: object) -> Mapping[str, Any]:
    return as_mapping(as_mapping(obj, "object").get("metadata"), "metadata")


def resource_version(obj: object) -> str | None:
    """``metadata.resourceVersion``, or None when absent or malformed."""
    try:
        rv = metadata(obj).get("resourceVersion")
    except KubeObjectError:
        return None
    return rv if isinstance(rv, str) and rv else None


def object_name(obj: object) -> str:
    name = metadata(obj).get("name")
    if not isinstance(name, str) or not name:
        raise KubeObjectError("object has no metadata.name")
    return name


def object_key(obj: object) -> str:
    """``namespace/name`` (``name`` for a cluster-scoped object)."""
    name = object_name(obj)
    namespace = metadata(obj).get("namespace")
    return f"{namespace}/{name}" if isinstance(namespace, str) and namespace else name


def labels(obj: object) -> Mapping[str, str]:
    raw = metadata(obj).get("labels")
    if raw is None:
        return {}
    found = as_mapping(raw, "metadata.labels")
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)}


def valid_node_name(name: object) -> str:
    """The normalised node name, or KubeObjectError: the one rule for every Raven part."""
    if not isinstance(name, str) or not name:
        raise KubeObjectError("no node name")
    why = node_name_error(name)
    if why is not None:
        raise KubeObjectError(f"node name {name[:EXCERPT_CHARS]!r} is not a valid node name: {why}")
    return normalize_node_name(name)


def node_name(obj: object) -> str:
    """The validated, normalised name of a Node object."""
    return valid_node_name(metadata(obj).get("name"))


def _ip(text: object) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not isinstance(text, str):
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def node_internal_ip(obj: object) -> str | None:
    """The node's InternalIP: the first IPv4 one, else the first IPv6 one, else None."""
    status = as_mapping(obj, "object").get("status")
    if status is None:
        return None
    addresses = as_mapping(status, "node status").get("addresses")
    if addresses is None:
        return None
    if not isinstance(addresses, list):
        raise KubeObjectError("node status.addresses is not a list")
    v6: str | None = None
    for entry in addresses:
        if not isinstance(entry, Mapping) or entry.get("type") != "InternalIP":
            continue
        ip = _ip(entry.get("address"))
        if ip is not None and ip.version == 4:
            return str(ip)
        if ip is not None and v6 is None:
            v6 = str(ip)
    return v6


def service_cluster_ips(obj: object) -> tuple[str, ...]:
    """``spec.clusterIPs`` (or ``spec.clusterIP``) normalised; () for headless/ExternalName."""
    spec = as_mapping(as_mapping(obj, "object").get("spec"), "Service spec")
    ips = spec.get("clusterIPs")
    if ips is None:
        single = spec.get("clusterIP")
        ips = [single] if single is not None else []
    if not isinstance(ips, list):
        raise KubeObjectError("Service spec.clusterIPs is not a list")
    out: list[str] = []
    for text in ips:
        if text in ("None", ""):
            continue
        ip = _ip(text)
        if ip is None:
            raise KubeObjectError(f"not an IP address: {str(text)[:80]!r}")
        if str(ip) not in out:
            out.append(str(ip))
    return tuple(out)


@dataclass(frozen=True)
class ServicePort:
    """One TCP port of a Service: the port clients use and what it targets."""

    port: int
    name: str
    target: int | str  # a number, or the name of a container port


def _port_number(value: object) -> int | None:
    return value if isinstance(value, int) and 0 < value < 65536 else None


def service_ports(obj: object) -> tuple[ServicePort, ...]:
    """The Service's TCP ports (garbage entries are left out)."""
    spec = as_mapping(as_mapping(obj, "object").get("spec"), "Service spec")
    ports = spec.get("ports") or []
    if not isinstance(ports, list):
        raise KubeObjectError("Service spec.ports is not a list")
    out = []
    for entry in ports:
        if not isinstance(entry, Mapping) or entry.get("protocol", "TCP") != "TCP":
            continue
        port = _port_number(entry.get("port"))
        if port is None:
            continue
        name = entry.get("name") if isinstance(entry.get("name"), str) else ""
        target = entry.get("targetPort", port)
        if not (isinstance(target, str) and target) and _port_number(target) is None:
            target = port
        out.append(ServicePort(port, str(name), target))
    return tuple(out)


@dataclass(frozen=True)
class SliceEndpoint:
    """A ready endpoint of an EndpointSlice on a known node."""

    node: str
    address: str
    ports: tuple[tuple[str, int], ...]  # (port name, port number)


def endpoint_slice_endpoints(obj: object) -> tuple[SliceEndpoint, ...]:
    """Ready endpoints with a valid nodeName, with the slice's TCP ports."""
    body = as_mapping(obj, "object")
    raw_ports = body.get("ports") or []
    if not isinstance(raw_ports, list):
        raise KubeObjectError("EndpointSlice ports is not a list")
    ports = tuple(
        (str(p.get("name") or ""), number)
        for p in raw_ports
        if isinstance(p, Mapping)
        and p.get("protocol", "TCP") == "TCP"
        and (number := _port_number(p.get("port"))) is not None
    )
    endpoints = body.get("endpoints") or []
    if not isinstance(endpoints, list):
        raise KubeObjectError("EndpointSlice endpoints is not a list")
    out = []
    for ep in endpoints:
        if not isinstance(ep, Mapping):
            continue
        conditions = ep.get("conditions")
        if isinstance(conditions, Mapping) and conditions.get("ready") is False:
            continue
        try:
            node = valid_node_name(ep.get("nodeName"))
        except KubeObjectError:
            continue
        addresses = ep.get("addresses")
        if not isinstance(addresses, list):
            continue
        ip = next((a for a in map(_ip, addresses) if a is not None), None)
        if ip is not None:
            out.append(SliceEndpoint(node, str(ip), ports))
    return tuple(out)
