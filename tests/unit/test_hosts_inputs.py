"""Parsing of every input: static YAML, registry JSON, Kubernetes objects; fuzzed."""

from __future__ import annotations

import contextlib
import ipaddress
import json

import pytest
from coredns_hosts.check import Mismatch, parse_server
from coredns_hosts.model import InputError
from coredns_hosts.render import render
from coredns_hosts.sources.kubernetes import _service_addresses
from coredns_hosts.sources.registry import RegistryError, parse_registry_nodes
from coredns_hosts.sources.static import parse_static
from hypothesis import given
from hypothesis import strategies as st

from raven.kube.objects import KubeObjectError, node_name, resource_version, service_cluster_ips

V4 = ipaddress.ip_address("10.96.0.50")
V6 = ipaddress.ip_address("fd00::50")


def test_static_full_document() -> None:
    text = """
gateway_addresses: [10.96.0.50, "fd00::50"]
nodes:
  - edge-gpu-1
  - name: edge-gpu-2
    addresses: [192.0.2.7]
  - bad_name
"""
    snap = parse_static(text, [], origin="static")
    assert [(e.name, e.addresses) for e in snap.entries] == [
        ("edge-gpu-1", (V4, V6)),
        ("edge-gpu-2", (ipaddress.ip_address("192.0.2.7"),)),
        ("bad_name", (V4, V6)),
    ]
    assert render(snap).invalid_names == ("bad_name",)


def test_static_bare_list_uses_default_addresses() -> None:
    snap = parse_static("- a\n- b\n", [V4], origin="s")
    assert [e.addresses for e in snap.entries] == [(V4,), (V4,)]
    assert parse_static("", [V4], origin="s").entries == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n", "no address"),
        ("nodes: [a]\ngateway_addresses: [300.1.1.1]\n", "gateway_addresses: not an IP"),
        ("nodes: {a: 1}\n", "nodes: expected a list"),
        ("nodes: [1]\ngateway_addresses: [10.0.0.1]\n", r"nodes\[0\]: expected a name"),
        ("nodes: [{addresses: [10.0.0.1]}]\n", r"nodes\[0\].name"),
        ("nodes: [{name: a, port: 1}]\n", "only 'name' and 'addresses'"),
        ("nodes: [{name: a, addresses: 10.0.0.1}]\n", "expected a list of IP"),
        ("nodez: []\n", "unknown keys"),
        ("nodes: [a\n", "not valid YAML"),
        ("42\n", "nodes: expected a list"),
        ("- !!python/object:os.system x\n", "not valid YAML"),
    ],
)
def test_static_errors(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_static(text, [], origin="s")


def test_registry_reachable_only() -> None:
    body = {
        "nodes": [
            {"node": "edge-gpu-1", "reachable": True, "agents": [{"agent": "site-a"}]},
            {"node": "edge-gpu-2", "reachable": False, "agents": []},
            {"node": "Bad_Name", "reachable": True, "agents": []},
        ]
    }
    assert parse_registry_nodes(json.dumps(body)) == {"edge-gpu-1", "Bad_Name"}
    assert parse_registry_nodes(b'{"nodes": []}') == frozenset()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("<html>502 Bad Gateway</html>", "not JSON"),
        ("[]", "'nodes' list"),
        ('{"nodes": {}}', "'nodes' list"),
        ('{"nodes": [1]}', r"nodes\[0\]: expected an object"),
        ('{"nodes": [{"reachable": true}]}', r"nodes\[0\].node"),
        ('{"nodes": [{"node": "a", "reachable": "yes"}]}', r"nodes\[0\].reachable"),
        ("[" * 100_000 + "]" * 100_000, "not JSON|'nodes' list"),
    ],
)
def test_registry_errors(body: str, message: str) -> None:
    with pytest.raises(RegistryError, match=message):
        parse_registry_nodes(body)


def test_service_cluster_ips() -> None:
    dual = {"spec": {"clusterIP": "10.96.0.50", "clusterIPs": ["10.96.0.50", "fd00::50"]}}
    assert service_cluster_ips(dual) == ("10.96.0.50", "fd00::50")
    assert _service_addresses(dual) == (V4, V6)
    assert service_cluster_ips({"spec": {"clusterIP": "10.96.0.50"}}) == ("10.96.0.50",)
    assert service_cluster_ips({"spec": {"clusterIP": "None", "clusterIPs": ["None"]}}) == ()
    assert service_cluster_ips({"spec": {"type": "ExternalName", "externalName": "x"}}) == ()
    with pytest.raises(KubeObjectError):
        service_cluster_ips({"spec": {"clusterIPs": ["garbage"]}})
    with pytest.raises(KubeObjectError):
        service_cluster_ips({"metadata": {}})
    assert _service_addresses({"spec": {"clusterIPs": ["garbage"]}}) == ()


def test_node_name_and_resource_version() -> None:
    """One node-name rule for the tunnel and DNS: raven.kube.objects.node_name."""
    assert node_name({"metadata": {"name": "Edge-1"}}) == "edge-1"
    assert resource_version({"metadata": {"resourceVersion": "42"}}) == "42"
    for bad in ({}, {"metadata": None}, {"metadata": {"name": 3}}, {"metadata": {"name": "a_b"}}):
        with pytest.raises(KubeObjectError):
            node_name(bad)
    for bad_obj in (None, [], {"metadata": {}}, {"metadata": {"resourceVersion": 5}}):
        assert resource_version(bad_obj) is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
registry_like = st.fixed_dictionaries(
    {
        "nodes": st.lists(
            st.fixed_dictionaries(
                {"node": st.text(max_size=20) | st.integers(), "reachable": json_values}
            ),
            max_size=5,
        )
    }
)


@given(
    st.one_of(st.binary(max_size=200), json_values.map(json.dumps), registry_like.map(json.dumps))
)
def test_registry_fuzz(body: bytes | str) -> None:
    try:
        names = parse_registry_nodes(body)
    except RegistryError:
        return
    assert all(isinstance(n, str) for n in names)


yaml_docs = st.one_of(
    st.text(max_size=200),
    st.lists(st.text(max_size=12) | st.integers() | st.none(), max_size=5).map(json.dumps),
    st.fixed_dictionaries({"gateway_addresses": json_values, "nodes": json_values}).map(
        json.dumps
    ),  # JSON is YAML
    st.builds(
        lambda names, addrs: (
            "nodes:\n"
            + "".join(
                f"  - name: {json.dumps(n)}\n    addresses: {json.dumps(addrs)}\n" for n in names
            )
        ),
        st.lists(st.text(max_size=10), max_size=4),
        st.lists(st.sampled_from(["10.0.0.1", "fd00::1", "x", "1.2.3"]), max_size=3),
    ),
)


@given(yaml_docs)
def test_static_fuzz(text: str) -> None:
    try:
        snap = parse_static(text, [V4], origin="fuzz")
    except InputError:
        return
    out = render(snap)  # whatever parses must render without error
    assert len(out.entries) + len(out.invalid_names) + len(out.unresolved_names) <= len(
        snap.entries
    )


@given(json_values)
def test_kubernetes_object_fuzz(obj: object) -> None:
    for parse in (node_name, service_cluster_ips, resource_version):
        with contextlib.suppress(KubeObjectError):
            parse(obj if isinstance(obj, dict) else {"spec": obj, "metadata": obj})  # type: ignore[operator]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.96.0.10", ("10.96.0.10", 53)),
        ("127.0.0.1:5353", ("127.0.0.1", 5353)),
        ("[fd00::10]:5353", ("fd00::10", 5353)),
        ("[fd00::10]", ("fd00::10", 53)),
        ("fd00::10", ("fd00::10", 53)),
    ],
)
def test_check_parse_server(text: str, expected: tuple[str, int]) -> None:
    assert parse_server(text) == expected


@pytest.mark.parametrize(
    "bad", ["", "dns.example", "10.0.0.1:0", "10.0.0.1:x", "[fd00::1", "[::1]x"]
)
def test_check_parse_server_rejects(bad: str) -> None:
    with pytest.raises(InputError):
        parse_server(bad)


def test_mismatch_describe() -> None:
    m = Mismatch("edge-1", "A", frozenset({V4}), frozenset(), "NXDOMAIN")
    assert m.describe() == "MISMATCH edge-1 A: expected 10.96.0.50 got - (NXDOMAIN)"
