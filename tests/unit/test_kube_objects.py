"""raven.kube's pure parts: objects as untrusted JSON, the cache a reflector keeps, its
schedule on a hand clock; and the fake API server's selector semantics."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.nodes_k8s import decode_node
from raven.kube.cache import Cache, Schedule, WatchFailed, WatchGone
from raven.kube.objects import (
    KubeObjectError,
    endpoint_slice_endpoints,
    node_internal_ip,
    node_name,
    service_ports,
)
from raven.protocol.names import is_valid_node_name
from raven.runtime.backoff import backoff_delay
from tests.helpers.fakekube import field_selector_matches, make_node, selector_matches


def _node(name: str = "edge-gpu-1", ips: list[str] | None = None, rv: str = "7") -> dict[str, Any]:
    obj = make_node(name, {"site": "a"}, internal_ips=ips if ips is not None else ["192.168.1.10"])
    obj["metadata"]["resourceVersion"] = rv
    return obj


def parse_node(obj: object) -> tuple[str, str | None]:
    return node_name(obj), node_internal_ip(obj)


def node_table() -> Cache[tuple[str, str]]:
    return Cache("nodes", decode_node)


def snapshot(table: Cache[tuple[str, str]]) -> dict[str, str]:
    return dict(sorted(table.items.values()))


def test_parse_node_name_and_internal_ip() -> None:
    assert parse_node(_node()) == ("edge-gpu-1", "192.168.1.10")


def test_ipv4_preferred_over_ipv6_whatever_the_order() -> None:
    assert node_internal_ip(_node(ips=["fd00::1", "10.0.0.1"])) == "10.0.0.1"
    assert node_internal_ip(_node(ips=["10.0.0.1", "fd00::1"])) == "10.0.0.1"


def test_ipv6_fallback_is_normalised() -> None:
    assert node_internal_ip(_node(ips=["FD00:0::0001"])) == "fd00::1"


def test_external_and_hostname_addresses_are_not_used() -> None:
    obj = make_node(
        "n1", extra_addresses=[{"type": "ExternalIP", "address": "203.0.113.1"}], internal_ips=[]
    )
    assert node_internal_ip(obj) is None


def test_invalid_internal_ip_entries_are_ignored() -> None:
    obj = _node(ips=["not-an-ip", "10.0.0.2"])
    obj["status"]["addresses"].insert(0, {"type": "InternalIP", "address": 5})
    obj["status"]["addresses"].insert(0, "garbage")
    assert node_internal_ip(obj) == "10.0.0.2"


def test_missing_status_means_no_address() -> None:
    obj = _node()
    del obj["status"]
    assert parse_node(obj) == ("edge-gpu-1", None)


def test_node_names_are_validated_and_normalised() -> None:
    assert parse_node(_node(name="Edge-GPU-1.example"))[0] == "edge-gpu-1.example"
    for bad in ("", "-x", "a_b", "10.0.0.1", "x" * 64, "é", "edge-gpu-7.", "123", "site.42"):
        with pytest.raises(KubeObjectError):
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
    with pytest.raises(KubeObjectError):
        parse_node(obj)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
    )
)
def test_any_json_parses_or_raises_node_object_error(obj: object) -> None:
    """Any decoded JSON either parses to (valid name, address or None) or raises KubeObjectError."""
    try:
        name, address = parse_node(obj)
    except KubeObjectError:
        return
    assert is_valid_node_name(name)
    assert address is None or ipaddress.ip_address(address)


def test_table_replace_skips_garbage_and_addressless(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="raven.kube")
    table = node_table()
    table.replace(
        [_node("b", ["10.0.0.2"]), "junk", _node("a", ["10.0.0.1"]), _node("c", [])], "42"
    )
    assert snapshot(table) == {"a": "10.0.0.1", "b": "10.0.0.2"}
    assert list(snapshot(table)) == ["a", "b"]
    assert table.resource_version == "42"
    assert "skipping garbage object in list" in caplog.text


def test_table_events_add_modify_delete_and_track_resource_version() -> None:
    table = node_table()
    table.replace([], "1")
    table.apply_event({"type": "ADDED", "object": _node("n1", ["10.0.0.1"], rv="2")})
    assert snapshot(table) == {"n1": "10.0.0.1"} and table.resource_version == "2"
    table.apply_event({"type": "MODIFIED", "object": _node("n1", ["10.0.0.9"], rv="3")})
    assert snapshot(table) == {"n1": "10.0.0.9"} and table.resource_version == "3"
    table.apply_event({"type": "MODIFIED", "object": _node("n1", [], rv="4")})
    assert snapshot(table) == {} and table.resource_version == "4"
    table.apply_event({"type": "ADDED", "object": _node("n1", ["10.0.0.1"], rv="5")})
    table.apply_event({"type": "DELETED", "object": _node("n1", ["10.0.0.1"], rv="6")})
    assert snapshot(table) == {} and table.resource_version == "6"


def test_bookmark_moves_resource_version_only() -> None:
    table = node_table()
    table.replace([_node("n1")], "1")
    table.apply_event(
        {"type": "BOOKMARK", "object": {"kind": "Node", "metadata": {"resourceVersion": "99"}}}
    )
    assert table.resource_version == "99"
    assert snapshot(table) == {"n1": "192.168.1.10"}
    table.apply_event({"type": "BOOKMARK", "object": {"metadata": {}}})
    assert table.resource_version == "99"


def test_error_events() -> None:
    table = node_table()
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}
    with pytest.raises(WatchGone, match="too old"):
        table.apply_event(gone)
    with pytest.raises(WatchFailed, match="code=500"):
        table.apply_event({"type": "ERROR", "object": {"code": 500, "message": "boom"}})
    with pytest.raises(WatchFailed):
        table.apply_event({"type": "ERROR", "object": "garbage"})


def test_garbage_events_change_nothing(caplog: pytest.LogCaptureFixture) -> None:
    table = node_table()
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
    assert snapshot(table) == {"n1": "192.168.1.10"}
    assert table.resource_version == "1"
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 5


def test_backoff_is_bounded_with_jitter() -> None:
    rng = random.Random(1)
    for attempt in range(40):
        delay = backoff_delay(attempt, 0.5, 30.0, rng)
        assert 0.25 <= delay <= 30.0
    assert max(backoff_delay(0, 0.5, 30.0, rng) for _ in range(200)) <= 0.5


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


class HandClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_schedule_resync_and_watch_timeout_on_a_hand_clock() -> None:
    clock = HandClock()
    s = Schedule(
        min_backoff_s=0.5, max_backoff_s=4.0, resync_s=600, clock=clock, rng=random.Random(2)
    )
    assert s.resync_due()  # never listed
    s.listed()
    assert not s.resync_due()
    assert s.watch_timeout(300) == 300
    clock.now += 500
    assert s.watch_timeout(300) == 101  # the watch ends at the resync
    clock.now += 100
    assert s.resync_due()
    never = Schedule(min_backoff_s=1, max_backoff_s=1, resync_s=0, clock=clock, rng=s.rng)
    never.listed()
    clock.now += 10**6
    assert not never.resync_due() and never.watch_timeout(300) == 300


def test_schedule_backoff_grows_bounded_and_resets_after_a_healthy_watch() -> None:
    clock = HandClock()
    s = Schedule(
        min_backoff_s=0.5, max_backoff_s=4.0, resync_s=0, clock=clock, rng=random.Random(3)
    )
    delays = [s.failed() for _ in range(20)]
    assert all(0.25 <= d <= 4.0 for d in delays)
    assert s.attempt == 20
    started = clock.now
    assert not s.watched(started, events=0)  # ended at once, nothing seen: unhealthy
    assert s.attempt == 20
    assert s.watched(started, events=1)
    assert s.attempt == 0
    clock.now += 5
    assert s.watched(started, events=0)  # a quiet watch that lasted is healthy too
    assert s.gone() == 0.0  # the first 410 relists at once
    assert 0.25 <= s.gone() <= 0.5  # 410s in a row back off
    with pytest.raises(ValueError):
        Schedule(min_backoff_s=2, max_backoff_s=1, resync_s=0, clock=clock, rng=s.rng)


def test_cache_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    table: Cache[tuple[str, str]] = Cache("nodes", decode_node, max_items=2)
    table.replace([_node(f"n{i}", [f"10.0.0.{i}"]) for i in range(1, 5)], "1")
    assert len(table.items) == 2
    assert not table.apply_event({"type": "ADDED", "object": _node("n9", ["10.0.0.9"], rv="2")})
    assert len(table.items) == 2 and table.resource_version == "2"
    assert "more than 2 objects" in caplog.text


def test_service_ports_and_endpoint_slices() -> None:
    svc = {
        "metadata": {"name": "dcgm-exporter", "namespace": "gpu"},
        "spec": {
            "ports": [
                {"name": "metrics", "port": 9400, "targetPort": "metrics", "protocol": "TCP"},
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "bad", "port": 70000},
                {"port": 8080, "targetPort": 18080},
                "junk",
            ]
        },
    }
    ports = service_ports(svc)
    assert [(p.port, p.name, p.target) for p in ports] == [
        (9400, "metrics", "metrics"),
        (8080, "", 18080),
    ]
    eps = {
        "metadata": {"name": "dcgm-exporter-abcde", "namespace": "gpu"},
        "addressType": "IPv4",
        "ports": [{"name": "metrics", "port": 9400, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": ["10.244.1.7"], "nodeName": "Edge-GPU-1", "conditions": {"ready": True}},
            {"addresses": ["10.244.2.7"], "nodeName": "edge-gpu-2", "conditions": {"ready": False}},
            {"addresses": ["10.244.3.7"]},  # no node
            {"addresses": ["nope"], "nodeName": "edge-gpu-3"},
            {"addresses": ["10.244.4.7"], "nodeName": "Bad_Name"},
            "junk",
        ],
    }
    (ep,) = endpoint_slice_endpoints(eps)
    assert (ep.node, ep.address, ep.ports) == ("edge-gpu-1", "10.244.1.7", (("metrics", 9400),))
    for bad in ({"endpoints": "x"}, {"ports": 5}, "slice"):
        with pytest.raises(KubeObjectError):
            endpoint_slice_endpoints(bad)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
    )
)
def test_service_and_slice_parsers_take_any_json(obj: object) -> None:
    for parse in (service_ports, endpoint_slice_endpoints):
        with contextlib.suppress(KubeObjectError):
            parse(obj)
