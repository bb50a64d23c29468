"""One node-name rule: the tunnel (frames), the gateway's registration check, the agent's
config and Kubernetes node table, the proxy and the hosts-file generator all accept exactly the
same names, so a name the tunnel serves always resolves in DNS and the reverse."""

from __future__ import annotations

import base64
import ipaddress
from typing import Any

import pytest
from coredns_hosts.model import Entry, Snapshot
from coredns_hosts.render import parse_hosts, render
from hypothesis import given
from hypothesis import strategies as st

from cloud_gateway.proxy.errors import ProxyError
from cloud_gateway.proxy.target import check_node
from cloud_gateway.registry import check_registration
from raven.config.gateway import AuthorisedAgent
from raven.kube.objects import KubeObjectError, node_name
from raven.protocol.errors import LocalProtocolError, RemoteProtocolError
from raven.protocol.frames import OpenFrame, encode_frame, parse_frames
from raven.protocol.names import (
    _label_rules_error,
    canonical_node_name,
    is_ip_literal,
    is_valid_node_name,
    node_name_error,
)

GATEWAY_IP = ipaddress.ip_address("10.96.0.50")
ANYONE = AuthorisedAgent(
    name="site-a", public_key=base64.b64encode(bytes(32)).decode(), nodes=["*"]
)


def tunnel_accepts(name: str) -> str | None:
    try:
        wire = encode_frame(OpenFrame(2, name, 9400))
    except LocalProtocolError:
        return None
    try:
        (frame,) = parse_frames(wire)
    except RemoteProtocolError:  # pragma: no cover - the encoder let it through
        return None
    assert isinstance(frame, OpenFrame)
    return frame.node


def registry_accepts(name: str) -> str | None:
    nodes, _, refused = check_registration(ANYONE, (name,), ())
    assert len(nodes) + len(refused) == 1
    return nodes[0] if nodes else None


def dns_serves(name: str) -> str | None:
    rendered = render(Snapshot((Entry(name, (GATEWAY_IP,)),), origin="test"))
    served = list(parse_hosts(rendered.text))
    assert len(served) <= 1
    return served[0] if served else None


def kubernetes_accepts(name: str) -> str | None:
    node: dict[str, Any] = {"metadata": {"name": name}, "status": {"addresses": []}}
    try:
        return node_name(node)
    except KubeObjectError:
        return None


def proxy_accepts(name: str) -> str | None:
    try:
        return check_node(name)
    except ProxyError:
        return None


CONSUMERS = (tunnel_accepts, registry_accepts, dns_serves, kubernetes_accepts)


def verdicts(name: str) -> dict[str, str | None]:
    return {consumer.__name__: consumer(name) for consumer in CONSUMERS}


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("edge-gpu-7", "edge-gpu-7"),
        ("Edge-GPU-7", "edge-gpu-7"),
        ("edge-gpu-7.site-a.example", "edge-gpu-7.site-a.example"),
        ("7gpu", "7gpu"),
        ("site.42x", "site.42x"),
        ("a" * 63, "a" * 63),
        (".".join(["a" * 63] * 3 + ["a" * 61]), ".".join(["a" * 63] * 3 + ["a" * 61])),
        # refused everywhere: DNS would not serve them
        ("123", None),  # inet_aton reads it as 0.0.0.123
        ("site.42", None),  # all-numeric top label
        ("edge-gpu-7.", None),  # absolute name: not a Kubernetes node name
        ("10.0.0.1", None),
        ("::1", None),
        ("edge_gpu", None),
        ("edge-*", None),
        ("-edge", None),
        ("edge..gpu", None),
        ("a" * 64, None),
        (".".join(["a" * 63] * 4), None),  # 255 characters
        ("édge", None),
        ("edge\n10.0.0.1 evil", None),
        ("", None),
    ],
)
def test_every_consumer_gives_the_same_verdict(name: str, canonical: str | None) -> None:
    assert canonical_node_name(name) == canonical
    assert (node_name_error(name) is None) == (canonical is not None)
    assert verdicts(name) == {consumer.__name__: canonical for consumer in CONSUMERS}


names = st.one_of(
    st.text(alphabet=st.sampled_from("abZ09-._*\n é"), max_size=70),
    st.from_regex(r"[a-z0-9-]{1,8}(\.[a-z0-9-]{1,8}){0,3}\.?", fullmatch=True),
    st.integers(min_value=0, max_value=10**6).map(str),
)


@given(names)
def test_consumers_agree_on_any_text(name: str) -> None:
    canonical = canonical_node_name(name)
    assert set(verdicts(name).values()) == {canonical}
    if canonical is not None:
        assert is_valid_node_name(canonical) and canonical == name.lower()


@given(names)
def test_the_proxy_takes_the_node_names_plus_one_absolute_dot(name: str) -> None:
    """A Host header may name a node absolutely (``edge-gpu-7.``); nothing else extra."""
    expected = canonical_node_name(name[:-1] if name.endswith(".") else name)
    assert proxy_accepts(name) == expected


def _parses_as_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


@given(st.one_of(names, st.ip_addresses().map(str), st.text(alphabet="0123456789.:abcdef[]%")))
def test_ip_literal_check_agrees_with_ipaddress(text: str) -> None:
    """The exception-free fast path of is_ip_literal never changes its answer."""
    bracketed = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    assert is_ip_literal(text) == _parses_as_ip(bracketed)


@given(
    st.one_of(
        names,
        st.text(alphabet=st.sampled_from("aZ9-.:[]\u212a\u0131"), max_size=20),
        st.from_regex(r"[a-zA-Z0-9-]{1,70}(\.[a-zA-Z0-9-]{0,70}){0,4}", fullmatch=True),
        st.from_regex(r"[a-z0-9-]{60,66}(\.[a-z0-9-]{1,66}){2,4}", fullmatch=True),
        st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){0,4}", fullmatch=True),
    )
)
def test_one_match_check_agrees_with_the_rules(name: str) -> None:
    """node_name_error's one-match fast path accepts exactly what the rules accept, the
    Kelvin sign and dotless i included (case-insensitive matching must not fold them)."""
    assert (node_name_error(name) is None) == (_label_rules_error(name) is None)
    if node_name_error(name) is not None:
        assert node_name_error(name) == _label_rules_error(name)
