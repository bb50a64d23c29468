"""deploy/helm/raven: rendered, validated against the Kubernetes schemas, checked for consistency.

No `helm` binary comes from Debian or PyPI, so the chart is rendered by :class:`ChartRenderer`,
a small Go text/template engine limited to what the chart's templates use: ``{{- -}}``
trimming, comments, ``if``/``else``/``end``, ``range`` over lists, ``define``/``include``,
``$`` and ``.`` field chains, parenthesised pipelines, and the functions in
:data:`FUNCTIONS` (Sprig's ``toYaml``, ``nindent``, ``quote``, ``b64enc``, ``default``,
``required``, ``printf``, ``list``, ``and``, ``not``, ``print``, ``sha256sum``) plus
``.Files.Get``. Any other construct is an error, so a chart change that needs more fails here
loudly instead of rendering wrongly. Where a real `helm` is installed (PATH or ``$RAVEN_HELM``),
a test checks that `helm template` renders the same objects.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from raven import keys
from raven.cli import build_parser
from raven.config import load_agent_config, load_gateway_config
from raven.config.common import parse_hostport
from tests.unit.test_deploy_common import (
    ROOT,
    check_workloads,
    container,
    find,
    pod_spec,
    validate_object,
)

CHART = ROOT / "deploy" / "helm" / "raven"
RELEASE = {"Name": "raven", "Namespace": "raven-system", "Service": "Helm"}


# --- a limited Go text/template engine -------------------------------------------------------


class TemplateError(Exception):
    pass


@dataclass
class Text:
    text: str


@dataclass
class Action:
    pipeline: list[Any]


@dataclass
class If:
    cond: list[Any]
    then: list[Any] = field(default_factory=list)
    otherwise: list[Any] = field(default_factory=list)


@dataclass
class Range:
    over: list[Any]
    body: list[Any] = field(default_factory=list)


_ACTION = re.compile(r"\{\{(-?)(\s*)(.*?)(\s*)(-?)\}\}", re.S)
_TOKEN = re.compile(
    r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<num>-?\d+)|(?P<var>\$(?:\.[A-Za-z_]\w*)*)'
    r"|(?P<field>(?:\.[A-Za-z_]\w*)+|\.)|(?P<ident>[A-Za-z_]\w*)|(?P<punct>[()|]))"
)


def tokenize(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise TemplateError(f"cannot tokenize {text[pos:]!r}")
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


def parse_pipeline(tokens: list[tuple[str, str]]) -> list[Any]:
    """A pipeline is a list of commands; a command is a list of operands."""
    pipeline: list[list[Any]] = [[]]
    i = 0
    while i < len(tokens):
        kind, value = tokens[i]
        if value == "|" and kind == "punct":
            pipeline.append([])
        elif value == "(" and kind == "punct":
            depth, j = 1, i + 1
            while depth:
                if tokens[j] == ("punct", "("):
                    depth += 1
                elif tokens[j] == ("punct", ")"):
                    depth -= 1
                j += 1
            pipeline[-1].append(("pipe", parse_pipeline(tokens[i + 1 : j - 1])))
            i = j
            continue
        else:
            pipeline[-1].append((kind, value))
        i += 1
    if any(not cmd for cmd in pipeline):
        raise TemplateError("empty command in pipeline")
    return pipeline


def parse(source: str) -> tuple[list[Any], dict[str, list[Any]]]:
    """Template text -> (nodes, defined templates)."""
    pieces: list[Any] = []
    pos = 0
    for m in _ACTION.finditer(source):
        pieces.append(Text(source[pos : m.start()]))
        pieces.append((m.group(1) == "-", m.group(3), m.group(5) == "-"))
        pos = m.end()
    pieces.append(Text(source[pos:]))
    # trimming
    for i, piece in enumerate(pieces):
        if isinstance(piece, tuple):
            left, _body, right = piece
            if left and isinstance(pieces[i - 1], Text):
                pieces[i - 1] = Text(pieces[i - 1].text.rstrip(" \t\r\n"))
            if right and isinstance(pieces[i + 1], Text):
                pieces[i + 1] = Text(pieces[i + 1].text.lstrip(" \t\r\n"))
    defines: dict[str, list[Any]] = {}
    root: list[Any] = []
    stack: list[tuple[str, Any, list[Any]]] = [("root", None, root)]
    for piece in pieces:
        if isinstance(piece, Text):
            if piece.text:
                stack[-1][2].append(piece)
            continue
        body = piece[1]
        if body.startswith("/*"):
            if not body.endswith("*/"):
                raise TemplateError(f"bad comment {body!r}")
            continue
        words = body.split(None, 1)
        keyword = words[0] if words else ""
        rest = words[1] if len(words) > 1 else ""
        if keyword == "if":
            node = If(parse_pipeline(tokenize(rest)))
            stack[-1][2].append(node)
            stack.append(("if", node, node.then))
        elif keyword == "range":
            if ":=" in rest:
                raise TemplateError("range with variables is not supported")
            node = Range(parse_pipeline(tokenize(rest)))
            stack[-1][2].append(node)
            stack.append(("range", node, node.body))
        elif keyword == "else":
            kind, node, _ = stack.pop()
            if kind != "if" or rest:
                raise TemplateError("else outside if (or else if) is not supported")
            stack.append(("else", node, node.otherwise))
        elif keyword == "define":
            if len(stack) != 1:
                raise TemplateError("define must be at the top level")
            name = json.loads(rest.strip())
            defines[name] = []
            stack.append(("define", name, defines[name]))
        elif keyword == "end":
            if len(stack) == 1:
                raise TemplateError("end without a block")
            stack.pop()
        elif keyword in {"with", "template", "block", "break", "continue"}:
            raise TemplateError(f"{keyword} is not supported by this renderer")
        else:
            stack[-1][2].append(Action(parse_pipeline(tokenize(body))))
    if len(stack) != 1:
        raise TemplateError(f"unclosed {stack[-1][0]}")
    return root, defines


def truthy(value: Any) -> bool:
    return value not in (None, False, 0, "") and not (isinstance(value, list | dict) and not value)


class _GoYamlDumper(yaml.SafeDumper):
    """PyYAML emitting like go-yaml v2 (Helm's toYaml): double quotes where quotes are needed."""

    def choose_scalar_style(self) -> Any:
        style = super().choose_scalar_style()
        return '"' if style == "'" else style


def _represent_float(dumper: yaml.SafeDumper, value: float) -> Any:
    """Helm's values are JSON numbers: 10.0 prints as 10."""
    if value.is_integer():
        return dumper.represent_int(int(value))
    return dumper.represent_float(value)


_GoYamlDumper.add_representer(float, _represent_float)


def to_yaml(value: Any) -> str:
    if value is None:
        return "null"
    text = yaml.dump(value, Dumper=_GoYamlDumper, default_flow_style=False, sort_keys=True)
    return text.removesuffix("\n")


def go_print(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list):
        return "[" + " ".join(go_print(v) for v in value) + "]"
    return str(value)


def _required(msg: str, value: Any) -> Any:
    if value is None or value == "":
        raise TemplateError(msg)
    return value


def _and(*args: Any) -> Any:
    for a in args:
        if not truthy(a):
            return a
    return args[-1]


def _print(*args: Any) -> str:
    out = ""
    for i, a in enumerate(args):
        if i and not isinstance(a, str) and not isinstance(args[i - 1], str):
            out += " "
        out += go_print(a)
    return out


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "toYaml": to_yaml,
    "nindent": lambda n, s: "\n" + "\n".join(" " * n + line for line in s.split("\n")),
    "quote": lambda v: json.dumps(go_print(v)),
    "b64enc": lambda s: base64.b64encode(s.encode()).decode(),
    "default": lambda d, v=None: v if truthy(v) else d,
    "required": _required,
    "printf": lambda fmt, *args: fmt % tuple(go_print(a) for a in args),
    "list": lambda *args: list(args),
    "and": _and,
    "not": lambda v: not truthy(v),
    "print": _print,
    "sha256sum": lambda s: hashlib.sha256(s.encode()).hexdigest(),
}


class ChartRenderer:
    """Renders the chart's templates with values, the way `helm template` does (subset)."""

    def __init__(self, chart: Path) -> None:
        self.chart = chart
        self.meta = yaml.safe_load((chart / "Chart.yaml").read_text())
        self.defines: dict[str, list[Any]] = {}
        self.files: dict[str, list[Any]] = {}
        for path in sorted((chart / "templates").iterdir()):
            nodes, defines = parse(path.read_text(encoding="utf-8"))
            self.defines.update(defines)
            self.files[path.name] = nodes
            self.defines[f"{self.meta['name']}/templates/{path.name}"] = nodes

    def render(self, values: dict[str, Any]) -> dict[str, str]:
        """File name -> rendered text, for every manifest template."""
        root = {
            "Values": values,
            "Release": RELEASE,
            "Chart": {
                "Name": self.meta["name"],
                "Version": self.meta["version"],
                "AppVersion": self.meta["appVersion"],
            },
            "Template": {"BasePath": f"{self.meta['name']}/templates"},
            "Files": {"Get": self._file},
        }
        return {
            name: self._nodes(nodes, root, root)
            for name, nodes in self.files.items()
            if not name.startswith("_") and name.endswith((".yaml", ".yml"))
        }

    def _file(self, path: str) -> str:
        return (self.chart / path).read_text(encoding="utf-8")

    def _nodes(self, nodes: list[Any], dot: Any, root: Any) -> str:
        out = []
        for node in nodes:
            if isinstance(node, Text):
                out.append(node.text)
            elif isinstance(node, Action):
                out.append(go_print(self._pipeline(node.pipeline, dot, root)))
            elif isinstance(node, If):
                branch = (
                    node.then if truthy(self._pipeline(node.cond, dot, root)) else node.otherwise
                )
                out.append(self._nodes(branch, dot, root))
            elif isinstance(node, Range):
                items = self._pipeline(node.over, dot, root) or []
                if not isinstance(items, list):
                    raise TemplateError("range over a non-list is not supported")
                out.extend(self._nodes(node.body, item, root) for item in items)
        return "".join(out)

    def _pipeline(self, pipeline: list[Any], dot: Any, root: Any) -> Any:
        value: Any = _NOTHING
        for cmd in pipeline:
            value = self._command(cmd, dot, root, value)
        return value

    def _command(self, cmd: list[Any], dot: Any, root: Any, piped: Any) -> Any:
        kind, word = cmd[0]
        if kind == "ident":
            if word == "include":
                name = self._operand(cmd[1], dot, root)
                data = self._operand(cmd[2], dot, root)
                if name not in self.defines:
                    raise TemplateError(f"no template {name!r}")
                return self._nodes(self.defines[name], data, root)
            if word not in FUNCTIONS:
                raise TemplateError(f"function {word!r} is not supported by this renderer")
            args = [self._operand(op, dot, root) for op in cmd[1:]]
            if piped is not _NOTHING:
                args.append(piped)
            return FUNCTIONS[word](*args)
        if kind == "field" and word == ".Files.Get":
            return self._file(self._operand(cmd[1], dot, root))
        if len(cmd) != 1 or piped is not _NOTHING:
            raise TemplateError(f"cannot call {word!r}")
        return self._operand(cmd[0], dot, root)

    def _operand(self, op: tuple[str, Any], dot: Any, root: Any) -> Any:
        kind, value = op
        if kind == "str":
            return json.loads(value)
        if kind == "num":
            return int(value)
        if kind == "pipe":
            return self._pipeline(value, dot, root)
        if kind == "field":
            return _lookup(dot, value)
        if kind == "var":
            return _lookup(root, value[1:] or ".")
        if kind == "ident" and value in FUNCTIONS:
            return FUNCTIONS[value]()
        raise TemplateError(f"unexpected operand {value!r}")


_NOTHING = object()


def _lookup(base: Any, chain: str) -> Any:
    value = base
    for part in filter(None, chain.split(".")):
        if value is None:
            return None
        if not isinstance(value, dict):
            raise TemplateError(f"cannot take .{part} of {type(value).__name__}")
        value = value.get(part)
    return value


# --- rendering the chart ----------------------------------------------------------------------


def default_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merged(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def keypair() -> tuple[str, str]:
    private = keys.generate_private_key()
    return keys.encode_key(private), keys.encode_key(keys.public_key(private))


def example_values(*, l3: bool = False, extras: bool = True) -> dict[str, Any]:
    gw_priv, gw_pub = keypair()
    a_priv, a_pub = keypair()
    _b_priv, b_pub = keypair()
    sites: list[dict[str, Any]] = [
        {"name": "site-a", "publicKey": a_pub, "privateKey": a_priv, "nodes": ["site-a-*"]},
        {
            "name": "site-b",
            "publicKey": b_pub,
            "existingSecret": "site-b-key",
            "nodes": ["site-b-gpu-1", "site-b-gpu-2"],
            "allowedPorts": [9400, 10266],
        },
    ]
    if l3:
        sites[0] |= {"prefixes": ["192.168.50.0/24"], "tunAddress": "10.99.0.2/24"}
        sites[1] |= {"prefixes": ["192.168.60.0/24"], "tunAddress": "10.99.0.3/24"}
    override: dict[str, Any] = {
        "gateway": {"publicKey": gw_pub, "privateKey": gw_priv},
        "sites": sites,
        "l3": {"enabled": l3},
        "serviceMonitor": {"enabled": extras},
        "grafanaDashboard": {"enabled": extras},
    }
    if extras:
        override["gateway"]["extraConfig"] = {"handshake_rate_per_s": 5.0}
        override["agent"] = {"extraConfig": {"reconnect": {"max_backoff_s": 10.0}}}
    return merged(default_values(), override)


def objects(rendered: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for name, text in rendered.items():
        for doc in yaml.safe_load_all(text):
            if doc:
                assert isinstance(doc, dict), name
                out.append(doc)
    return out


VARIANTS = {
    "defaults-no-sites": default_values,
    "two-sites": example_values,
    "two-sites-l3": lambda: example_values(l3=True),
    "two-sites-minimal": lambda: example_values(extras=False),
}


@pytest.fixture(scope="module")
def renderer() -> ChartRenderer:
    return ChartRenderer(CHART)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(
    request: pytest.FixtureRequest, renderer: ChartRenderer
) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    values = VARIANTS[request.param]()
    return request.param, values, objects(renderer.render(values))


# --- tests ------------------------------------------------------------------------------------


def test_every_rendered_object_is_valid_for_kubernetes(
    variant: tuple[str, dict[str, Any], list[dict[str, Any]]],
) -> None:
    name, _values, objs = variant
    ids = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs]
    assert len(ids) == len(set(ids)), name
    for o in objs:
        validate_object(o)
        assert o["metadata"]["labels"]["app.kubernetes.io/instance"] == "raven", ids


def test_workloads_follow_the_security_rules(
    variant: tuple[str, dict[str, Any], list[dict[str, Any]]],
) -> None:
    name, values, objs = variant
    check_workloads(objs, l3=values["l3"]["enabled"])
    gw_c = container(find(objs, "Deployment", "raven-gateway"), "gateway")
    assert ("NET_ADMIN" in gw_c["securityContext"]["capabilities"].get("add", [])) == (
        values["l3"]["enabled"]
    ), name


def test_configs_load_and_agree_with_the_objects(
    variant: tuple[str, dict[str, Any], list[dict[str, Any]]], tmp_path: Path
) -> None:
    _name, values, objs = variant
    gw_path = tmp_path / "gateway.yaml"
    gw_path.write_text(find(objs, "ConfigMap", "raven-gateway-config")["data"]["gateway.yaml"])
    gw_cfg = load_gateway_config(gw_path)
    assert [a.name for a in gw_cfg.agents] == [s["name"] for s in values["sites"]]
    if values["gateway"].get("extraConfig"):
        assert (
            gw_cfg.handshake_rate_per_s == values["gateway"]["extraConfig"]["handshake_rate_per_s"]
        )
    assert gw_cfg.tun.enabled == values["l3"]["enabled"]

    gw = find(objs, "Deployment", "raven-gateway")
    assert gw["spec"]["replicas"] == values["gateway"]["replicas"]
    ports = {p["name"]: p["containerPort"] for p in container(gw, "gateway")["ports"]}
    assert ports["tunnel"] == parse_hostport(gw_cfg.tunnel_listen)[1]
    assert ports["http-proxy"] == parse_hostport(gw_cfg.proxy.http_listen)[1]
    assert ports["admin"] == parse_hostport(gw_cfg.admin_listen)[1]
    (tls,) = gw_cfg.proxy.tls_listeners
    assert parse_hostport(tls.listen)[1] == ports["tls-proxy"]
    proxy = find(objs, "Service", "raven-gateway")
    by_port = {p["port"]: p["targetPort"] for p in proxy["spec"]["ports"]}
    assert by_port[tls.target_port] == "tls-proxy"
    for scraped in values["gateway"]["scrapedPorts"]:
        assert by_port[scraped["port"]] == "http-proxy"
    tunnel = find(objs, "Service", "raven-gateway-tunnel")
    assert tunnel["spec"]["clusterIP"] == "None"
    checksum = gw["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert re.fullmatch(r"[0-9a-f]{64}", checksum)

    secret_names = {o["metadata"]["name"] for o in objs if o["kind"] == "Secret"}
    for site in values["sites"]:
        cm = find(objs, "ConfigMap", f"raven-agent-config-{site['name']}")
        path = tmp_path / f"{site['name']}.yaml"
        path.write_text(cm["data"]["agent.yaml"])
        cfg = load_agent_config(path)
        assert cfg.gateway == (
            f"raven-gateway-tunnel.raven-system.svc.cluster.local:{ports['tunnel']}"
        )
        assert cfg.gateway_public_key == values["gateway"]["publicKey"]
        assert cfg.kubernetes.label_selector == f"raven.io/site={site['name']}"
        assert cfg.allowed_ports == site.get(
            "allowedPorts", [9400, 9100, 10250, 10255, values["agent"]["adminPort"]]
        )
        assert cfg.tun.enabled == values["l3"]["enabled"]
        if values["l3"]["enabled"]:
            assert cfg.subnets == site["prefixes"]
        if values["agent"].get("extraConfig"):
            assert cfg.reconnect.max_backoff_s == 10.0
        (authorised,) = [a for a in gw_cfg.agents if a.name == site["name"]]
        assert authorised.public_key == site["publicKey"]
        dep = find(objs, "Deployment", f"raven-agent-{site['name']}")
        spec = pod_spec(dep)
        assert spec["hostNetwork"] and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert spec["nodeSelector"] == {
            "raven.io/edge-gateway": "true",
            "raven.io/site": site["name"],
        }
        vols = {v["name"]: v for v in spec["volumes"]}
        assert vols["config"]["configMap"]["name"] == cm["metadata"]["name"]
        secret = vols["key-secret"]["secret"]["secretName"]
        if "existingSecret" in site:
            assert secret == site["existingSecret"] and secret not in secret_names
        else:
            assert secret in secret_names
            data = find(objs, "Secret", secret)["data"]["private.key"]
            assert base64.b64decode(data).decode() == site["privateKey"]
        args = build_parser().parse_args(container(dep, "agent")["args"])
        assert args.command == "agent"


def test_hosts_generator_arguments_and_rbac(
    variant: tuple[str, dict[str, Any], list[dict[str, Any]]],
) -> None:
    _name, values, objs = variant
    hg = values["hostsGenerator"]
    dep = find(objs, "Deployment", "raven-coredns-hosts")
    args = build_parser().parse_args(container(dep, "coredns-hosts")["args"])
    assert args.service == "raven-system/raven-gateway"
    assert args.configmap == f"{hg['configMap']['namespace']}/{hg['configMap']['name']}"
    assert args.configmap_key == hg["configMap"]["key"]
    assert args.node_selector == hg["nodeSelector"]
    role = find(objs, "Role", "raven-coredns-hosts")
    assert role["metadata"]["namespace"] == hg["configMap"]["namespace"]
    assert role["rules"][0]["resourceNames"] == [hg["configMap"]["name"]]
    cluster_role = find(objs, "ClusterRole", "raven-coredns-hosts")
    assert cluster_role["rules"][0]["resources"] == ["nodes", "services"]
    assert set(cluster_role["rules"][0]["verbs"]) == {"get", "list", "watch"}


def test_optional_parts_follow_their_switches(
    variant: tuple[str, dict[str, Any], list[dict[str, Any]]],
) -> None:
    _name, values, objs = variant
    kinds = [o["kind"] for o in objs]
    assert kinds.count("ServiceMonitor") == (2 if values["serviceMonitor"]["enabled"] else 0)
    dashboards = [o for o in objs if o["metadata"]["name"] == "raven-grafana-dashboard"]
    assert len(dashboards) == (1 if values["grafanaDashboard"]["enabled"] else 0)
    for d in dashboards:
        assert d["metadata"]["labels"]["grafana_dashboard"] == "1"
        shipped = json.loads(d["data"]["raven-tunnel.json"])
        assert shipped == json.loads((ROOT / "deploy/grafana/raven-tunnel.json").read_text())
    agents = [o for o in objs if o["kind"] == "Deployment" and "agent" in o["metadata"]["name"]]
    assert len(agents) == len(values["sites"])


def test_values_follow_the_chart_schema() -> None:
    """Helm checks values against values.schema.json; so does this test, for every variant."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    for make in VARIANTS.values():
        jsonschema.validate(make(), schema)
    typo = example_values()
    typo["sites"][0]["publickey"] = typo["sites"][0].pop("publicKey")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(typo, schema)
    bad_name = example_values()
    bad_name["sites"][0]["name"] = "Site_A"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad_name, schema)


def test_chart_dashboard_copy_is_identical_to_deploy_grafana() -> None:
    assert (CHART / "dashboards" / "raven-tunnel.json").read_bytes() == (
        ROOT / "deploy" / "grafana" / "raven-tunnel.json"
    ).read_bytes()


def test_required_values_are_enforced(renderer: ChartRenderer) -> None:
    values = example_values()
    values["gateway"]["publicKey"] = ""
    with pytest.raises(TemplateError, match=r"gateway\.publicKey"):
        renderer.render(values)
    values = example_values(l3=True)
    del values["sites"][0]["tunAddress"]
    with pytest.raises(TemplateError, match="tunAddress"):
        renderer.render(values)


def test_renderer_semantics_on_small_templates(tmp_path: Path) -> None:
    chart = tmp_path / "c"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("name: c\nversion: 1.0.0\nappVersion: '1'\n")
    (chart / "templates" / "_h.tpl").write_text('{{- define "x" -}}\na: {{ .v }}\n{{- end -}}\n')
    (chart / "templates" / "t.yaml").write_text(
        'k:\n  {{- include "x" .Values | nindent 2 }}\n'
        "{{- if .Values.flag }}\nyes: 1\n{{- else }}\nno: 1\n{{- end }}\n"
        "l:{{ range .Values.items }}\n- {{ . | quote }}{{ end }}\n"
        'd: {{ .Values.missing | default "dflt" }}\n'
        'p: {{ printf "%s-%s" .Release.Name "z" }}\n'
    )
    r = ChartRenderer(chart)
    out = r.render({"v": 1, "flag": False, "items": ["a", 2]})["t.yaml"]
    assert out == 'k:\n  a: 1\nno: 1\nl:\n- "a"\n- "2"\nd: dflt\np: raven-z\n'
    (chart / "templates" / "bad.yaml").write_text("{{ with .Values }}x{{ end }}\n")
    with pytest.raises(TemplateError, match="with"):
        ChartRenderer(chart)


def helm_binary() -> str | None:
    return os.environ.get("RAVEN_HELM") or shutil.which("helm")


@pytest.mark.parametrize("variant_name", sorted(VARIANTS))
def test_real_helm_renders_the_same_objects_when_available(
    variant_name: str, renderer: ChartRenderer, tmp_path: Path
) -> None:
    helm = helm_binary()
    if helm is None:
        pytest.skip("no helm binary (PATH or $RAVEN_HELM); the limited renderer is used")
    values = VARIANTS[variant_name]()
    values_file = tmp_path / "values.json"
    values_file.write_text(json.dumps(values))
    out = subprocess.run(
        [helm, "template", "raven", str(CHART), "-n", "raven-system", "-f", str(values_file)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    real = [d for d in yaml.safe_load_all(out) if d]
    ours = objects(renderer.render(values))

    def ident(o: dict[str, Any]) -> tuple[str, str]:
        return (o["kind"], o["metadata"]["name"])

    assert sorted(map(ident, real)) == sorted(map(ident, ours))
    real_by = {ident(o): o for o in real}
    for o in ours:
        assert real_by[ident(o)] == o, f"{variant_name}: {ident(o)} differs from helm's output"
