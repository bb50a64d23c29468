"""check-config of a rendered chart (``helm template raven deploy/helm/raven -f values.yaml >
rendered.yaml``, or the kustomize folder's ``raven.yaml``): the gateway and agent configs the
ConfigMaps carry, each checked like a file, and the ports they name checked against the
Kubernetes objects that must agree with them:

- every listener of the gateway config (tunnel, proxy, TLS listeners, WebSocket, admin) is a
  container port of the Deployment that mounts it, and every probe and Service target port
  of that Deployment names one of its container ports (probes: the admin port, the only one
  serving ``/readyz`` and ``/healthz``);
- an agent's ``gateway`` naming a Service of the rendering uses one of its ports, and that
  port reaches the gateway's tunnel listener (or its WebSocket listener for ``ws(s)://``);
- an agent's ``admin_listen`` is the port its own probes ask.

Findings inside an embedded config read ``rendered.yaml[ConfigMap/NAME KEY]:LINE:COL``; those
about an object ``rendered.yaml:LINE`` at the object's first line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from raven.config.agent import AgentConfig, parse_gateway
from raven.config.gateway import GatewayConfig
from raven.config.source import Document, Problem, parse_document
from raven.hostport import parse_hostport

__all__ = ["Embedded", "KubeObject", "check_ports", "embedded_configs", "parse_manifest"]

#: ConfigMap keys that hold a Raven config, and what they configure.
CONFIG_KEYS = {"gateway.yaml": "gateway", "agent.yaml": "agent"}


@dataclass(frozen=True)
class KubeObject:
    """One object of the rendering, with the line it starts on."""

    body: dict[str, Any]
    line: int

    @property
    def kind(self) -> str:
        return str(self.body.get("kind", ""))

    @property
    def name(self) -> str:
        return str((self.body.get("metadata") or {}).get("name", ""))

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True)
class Embedded:
    """A Raven config carried by a ConfigMap: its kind, its parsed text, the ConfigMap."""

    kind: str
    document: Document
    config_map: str


def parse_manifest(text: str) -> list[KubeObject] | None:
    """The objects of a multi-document Kubernetes YAML, or None when ``text`` is not one
    (a Raven config file is a single mapping without ``apiVersion``/``kind``)."""
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError:
        return None
    objects = []
    for node in nodes:
        if node is None:
            continue
        body = yaml.safe_load(yaml.serialize(node))
        if not isinstance(body, dict) or "apiVersion" not in body or "kind" not in body:
            return None
        objects.append(KubeObject(body, node.start_mark.line + 1))
    return objects or None


def embedded_configs(objects: list[KubeObject], file: str) -> list[Embedded]:
    out = []
    for obj in objects:
        if obj.kind != "ConfigMap":
            continue
        for key, value in sorted((obj.body.get("data") or {}).items()):
            kind = CONFIG_KEYS.get(str(key))
            if kind is not None and isinstance(value, str):
                label = f"{file}[{obj.ref} {key}]"
                out.append(Embedded(kind, parse_document(value, label), obj.name))
    return out


def _pod(obj: KubeObject) -> dict[str, Any]:
    spec = ((obj.body.get("spec") or {}).get("template") or {}).get("spec") or {}
    return spec if isinstance(spec, dict) else {}


def _mounts(obj: KubeObject, config_map: str) -> bool:
    volumes = _pod(obj).get("volumes") or []
    return any((v.get("configMap") or {}).get("name") == config_map for v in volumes)


def _workload_of(objects: list[KubeObject], config_map: str) -> KubeObject | None:
    kinds = ("Deployment", "DaemonSet", "StatefulSet")
    return next((o for o in objects if o.kind in kinds and _mounts(o, config_map)), None)


def _ports(workload: KubeObject) -> dict[str, int]:
    """Container ports of every container: name -> number (unnamed: their number as name)."""
    out: dict[str, int] = {}
    for container in _pod(workload).get("containers") or []:
        for port in container.get("ports") or []:
            number = int(port.get("containerPort", 0))
            out[str(port.get("name") or number)] = number
    return out


def _resolve(port: Any, ports: dict[str, int]) -> int | None:
    """A probe's or Service's target port (a name or a number) -> the container port."""
    if isinstance(port, int):
        return port if port in ports.values() else None
    return ports.get(str(port))


def _listed(ports: dict[str, int]) -> str:
    return ", ".join(f"{name}={number}" for name, number in ports.items()) or "none"


def _probe_ports(workload: KubeObject) -> list[tuple[str, Any]]:
    out = []
    for container in _pod(workload).get("containers") or []:
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            get = (container.get(probe) or {}).get("httpGet")
            if get:
                out.append((probe, get.get("port")))
    return out


def _selects(service: KubeObject, workload: KubeObject) -> bool:
    selector = (service.body.get("spec") or {}).get("selector") or {}
    labels = ((workload.body.get("spec") or {}).get("template") or {}).get("metadata") or {}
    pod_labels = labels.get("labels") or {}
    return bool(selector) and all(pod_labels.get(k) == v for k, v in selector.items())


def _gateway_listeners(config: GatewayConfig) -> dict[str, str]:
    """Field path -> host:port of every listener the gateway opens."""
    out = {"tunnel_listen": config.tunnel_listen, "admin_listen": config.admin_listen,
           "proxy.http_listen": config.proxy.http_listen}  # fmt: skip
    for i, listener in enumerate(config.proxy.tls_listeners):
        out[f"proxy.tls_listeners[{i}].listen"] = listener.listen
    if config.websocket.listen is not None:
        out["websocket.listen"] = config.websocket.listen
    return out


@dataclass
class _Findings:
    file: str
    problems: list[Problem]

    def at(self, obj: KubeObject, path: str, message: str) -> None:
        self.problems.append(Problem(path, f"{obj.ref}: {message}", self.file, (obj.line, 1)))

    def inside(self, doc: Document, path: str, message: str) -> None:
        self.problems.append(Problem(path, message, doc.file, doc.position_of(path, value=True)))


def check_ports(
    objects: list[KubeObject],
    gateway: tuple[Embedded, GatewayConfig] | None,
    agents: list[tuple[Embedded, AgentConfig]],
    file: str,
) -> list[Problem]:
    found = _Findings(file, [])
    if gateway is not None:
        _check_gateway(objects, *gateway, found)
    for embedded, agent in agents:
        _check_agent(objects, embedded, agent, gateway, found)
    return found.problems


def _check_workload_ports(
    objects: list[KubeObject], workload: KubeObject, admin_port: int, found: _Findings
) -> None:
    ports = _ports(workload)
    for probe, port in _probe_ports(workload):
        if _resolve(port, ports) != admin_port:
            found.at(workload, probe, f"probes port {port!r}, not the admin port {admin_port} "
                     "(the only one serving /readyz and /healthz)")  # fmt: skip
    for service in (o for o in objects if o.kind == "Service" and _selects(o, workload)):
        for port in (service.body.get("spec") or {}).get("ports") or []:
            target = port.get("targetPort", port.get("port"))
            if _resolve(target, ports) is None:
                found.at(service, f"ports.{port.get('name', port.get('port'))}",
                         f"targetPort {target!r} is not a container port of {workload.ref} "
                         f"({_listed(ports)})")  # fmt: skip


def _check_gateway(
    objects: list[KubeObject], embedded: Embedded, config: GatewayConfig, found: _Findings
) -> None:
    workload = _workload_of(objects, embedded.config_map)
    if workload is None:
        return
    ports = _ports(workload)
    for path, address in _gateway_listeners(config).items():
        port = parse_hostport(address)[1]
        if port not in ports.values():
            found.inside(embedded.document, path, f"port {port} is not a container port of "
                         f"{workload.ref} ({_listed(ports)}): nothing outside the pod reaches "
                         "it")  # fmt: skip
    _check_workload_ports(objects, workload, parse_hostport(config.admin_listen)[1], found)


def _service_named(objects: list[KubeObject], host: str) -> KubeObject | None:
    """The Service a cluster DNS name (``svc``, ``svc.ns``, ``svc.ns.svc.cluster.local``)
    points at, when the rendering has it."""
    parts = host.split(".")
    for obj in objects:
        if obj.kind != "Service" or obj.name != parts[0]:
            continue
        namespace = (obj.body.get("metadata") or {}).get("namespace")
        if len(parts) == 1 or namespace in (None, parts[1]):
            return obj
    return None


def _check_agent(
    objects: list[KubeObject],
    embedded: Embedded,
    config: AgentConfig,
    gateway: tuple[Embedded, GatewayConfig] | None,
    found: _Findings,
) -> None:
    workload = _workload_of(objects, embedded.config_map)
    if workload is not None:
        _check_workload_ports(objects, workload, parse_hostport(config.admin_listen)[1], found)
    host, port, ws_path = parse_gateway(config.gateway)
    service = _service_named(objects, host)
    if service is None or gateway is None:
        return  # an address outside the rendering (a load balancer, an Ingress)
    gw_config = gateway[1]
    wanted = gw_config.websocket.listen if ws_path is not None else gw_config.tunnel_listen
    what = "WebSocket listener (websocket.listen)" if ws_path is not None else "tunnel_listen"
    service_ports = (service.body.get("spec") or {}).get("ports") or []
    entry = next((p for p in service_ports if p.get("port") == port), None)
    if entry is None:
        listed = ", ".join(str(p.get("port")) for p in service_ports)
        found.inside(embedded.document, "gateway", f"port {port} is not a port of "
                     f"{service.ref} ({listed})")  # fmt: skip
        return
    gw_workload = _workload_of(objects, gateway[0].config_map)
    if wanted is None or gw_workload is None:
        return
    target = _resolve(entry.get("targetPort", port), _ports(gw_workload))
    if target != parse_hostport(wanted)[1]:
        found.inside(embedded.document, "gateway", f"{service.ref} port {port} reaches "
                     f"container port {target}, not the gateway's {what} "
                     f"({wanted})")  # fmt: skip
