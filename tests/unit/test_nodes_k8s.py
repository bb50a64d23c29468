"""The pure part of the Kubernetes node source: Node parsing and the node table."""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.nodes_k8s import (
    NodeObjectError,
    NodeTable,
    WatchFailed,
    WatchGone,
    _backoff_delay,
    internal_ip,
    parse_node,
)
from raven.protocol.names import is_valid_node_name
from tests.fakekube import field_selector_matches, make_node, selector_matches


def _node(name: str = "edge-gpu-1", ips: list[str] | None = None, rv: str = "7") -> dict[str, Any]:
    obj = make_node(name, {"site": "a"}, internal_ips=ips if ips is not None else ["192.168.1.10"])
    obj["metadata"]["resourceVersion"] = rv
    return obj


def test_parse_node_name_and_internal_ip() -> None:
    assert parse_node(_node()) == ("edge-gpu-1", "192.168.1.10")


def test_ipv4_preferred_over_ipv6_whatever_the_order() -> None:
    assert internal_ip(_node(ips=["fd00::1", "10.0.0.1"])) == "10.0.0.1"
    assert internal_ip(_node(ips=["10.0.0.1", "fd00::1"])) == "10.0.0.1"


def test_ipv6_fallback_is_normalised() -> None:
    assert internal_ip(_node(ips=["FD00:0::0001"])) == "fd00::1"


def test_external_and_hostname_addresses_are_not_used() -> None:
    obj = make_node(
        "n1", extra_addresses=[{"type": "ExternalIP", "address": "203.0.113.1"}], internal_ips=[]
    )
    assert internal_ip(obj) is None


def test_invalid_internal_ip_entries_are_ignored() -> None:
    obj = _node(ips=["not-an-ip", "10.0.0.2"])
    obj["status"]["addresses"].insert(0, {"type": "InternalIP", "address": 5})
    obj["status"]["addresses"].insert(0, "garbage")
    assert internal_ip(obj) == "10.0.0.2"


def test_missing_status_means_no_address() -> None:
    obj = _node()
    del obj["status"]
    assert parse_node(obj) == ("edge-gpu-1", None)


def test_node_names_are_validated_and_normalised() -> None:
    assert parse_node(_node(name="Edge-GPU-1.example"))[0] == "edge-gpu-1.example"
    for bad in ("", "-x", "a_b", "10.0.0.1", "x" * 64, "é", "edge-gpu-7.", "123", "site.42"):
        with pytest.raises(NodeObjectError):
            parse_node(_node(name=bad))


@pytest.mark.parametrize(
    "obj",
    [
        None,
        "node",
        [],
        {},
        {"metadata": []},
        {"metadata": {"name": 5}},
        {"metadata": {"name": "ok"}, "status": "x"},
        {"metadata": {"name": "ok"}, "status": {"addresses": {"a": 1}}},
    ],
)
def test_garbage_objects_raise_node_object_error(obj: object) -> None:
    with pytest.raises(NodeObjectError):
        parse_node(obj)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
    )
)
def test_any_json_parses_or_raises_node_object_error(obj: object) -> None:
    """Any decoded JSON either parses to (valid name, address or None) or raises NodeObjectError."""
    try:
        name, address = parse_node(obj)
    except NodeObjectError:
        return
    assert is_valid_node_name(name)
    assert address is None or ipaddress.ip_address(address)


def test_table_replace_skips_garbage_and_addressless(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="edge_agent.nodes_k8s")
    table = NodeTable.empty()
    table.replace(
        [_node("b", ["10.0.0.2"]), "junk", _node("a", ["10.0.0.1"]), _node("c", [])], "42"
    )
    assert table.snapshot() == {"a": "10.0.0.1", "b": "10.0.0.2"}
    assert list(table.snapshot()) == ["a", "b"]
    assert table.resource_version == "42"
    assert "skipping garbage node in list" in caplog.text


def test_table_events_add_modify_delete_and_track_resource_version() -> None:
    table = NodeTable.empty()
    table.replace([], "1")
    table.apply_event({"type": "ADDED", "object": _node("n1", ["10.0.0.1"], rv="2")})
    assert table.snapshot() == {"n1": "10.0.0.1"} and table.resource_version == "2"
    table.apply_event({"type": "MODIFIED", "object": _node("n1", ["10.0.0.9"], rv="3")})
    assert table.snapshot() == {"n1": "10.0.0.9"} and table.resource_version == "3"
    table.apply_event({"type": "MODIFIED", "object": _node("n1", [], rv="4")})
    assert table.snapshot() == {} and table.resource_version == "4"
    table.apply_event({"type": "ADDED", "object": _node("n1", ["10.0.0.1"], rv="5")})
    table.apply_event({"type": "DELETED", "object": _node("n1", ["10.0.0.1"], rv="6")})
    assert table.snapshot() == {} and table.resource_version == "6"


def test_bookmark_moves_resource_version_only() -> None:
    table = NodeTable.empty()
    table.replace([_node("n1")], "1")
    table.apply_event(
        {"type": "BOOKMARK", "object": {"kind": "Node", "metadata": {"resourceVersion": "99"}}}
    )
    assert table.resource_version == "99"
    assert table.snapshot() == {"n1": "192.168.1.10"}
    table.apply_event({"type": "BOOKMARK", "object": {"metadata": {}}})
    assert table.resource_version == "99"


def test_error_events() -> None:
    table = NodeTable.empty()
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}
    with pytest.raises(WatchGone, match="too old"):
        table.apply_event(gone)
    with pytest.raises(WatchFailed, match="code=500"):
        table.apply_event({"type": "ERROR", "object": {"code": 500, "message": "boom"}})
    with pytest.raises(WatchFailed):
        table.apply_event({"type": "ERROR", "object": "garbage"})


def test_garbage_events_change_nothing(caplog: pytest.LogCaptureFixture) -> None:
    table = NodeTable.empty()
    table.replace([_node("n1")], "1")
    garbage: list[object] = [
        None,
        [],
        {"type": 5},
        {"type": "ADDED", "object": {}},
        {"type": "WHAT"},
    ]
    for event in garbage:
        table.apply_event(event)
    assert table.snapshot() == {"n1": "192.168.1.10"}
    assert table.resource_version == "1"
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 5


def test_backoff_is_bounded_with_jitter() -> None:
    for attempt in range(40):
        delay = _backoff_delay(attempt, 0.5, 30.0)
        assert 0.25 <= delay <= 30.0
    assert max(_backoff_delay(0, 0.5, 30.0) for _ in range(200)) <= 0.5


@pytest.mark.parametrize(
    ("selector", "labels", "want"),
    [
        ("a=b", {"a": "b"}, True),
        ("a==b", {"a": "c"}, False),
        ("a!=b", {}, True),
        ("a,!c", {"a": "x"}, True),
        ("a in (x, y),c notin (z)", {"a": "y", "c": "w"}, True),
        ("a in (x,y)", {"a": "z"}, False),
        ("", {"q": "r"}, True),
    ],
)
def test_fakekube_selector(selector: str, labels: dict[str, str], want: bool) -> None:
    """The fake API server's selector semantics, which the integration tests rely on."""
    assert selector_matches(selector, labels) is want


@pytest.mark.parametrize(
    ("selector", "want"),
    [
        ("metadata.name=svc", True),
        ("metadata.name==svc", True),
        ("metadata.name=other", False),
        ("metadata.name!=svc", False),
        ("metadata.name=svc,metadata.namespace=ns", True),
        ("metadata.namespace!=ns", False),
        ("", True),
    ],
)
def test_fakekube_field_selector(selector: str, want: bool) -> None:
    """The fake API server's field selectors (the hosts source selects its Service by name)."""
    obj = {"metadata": {"name": "svc", "namespace": "ns"}}
    assert field_selector_matches(selector, obj) is want


@pytest.mark.parametrize("selector", ["spec.clusterIP=1.2.3.4", "metadata.name"])
def test_fakekube_field_selector_rejects_what_it_does_not_know(selector: str) -> None:
    with pytest.raises(ValueError):
        field_selector_matches(selector, {"metadata": {"name": "svc"}})
