"""Rendering, name validation, hosts parsing and the debouncer: pure code, no I/O."""

from __future__ import annotations

import ipaddress

import pytest
from coredns_hosts.debounce import Debouncer
from coredns_hosts.model import Entry, InputError, Snapshot, parse_address
from coredns_hosts.render import HEADER, expected_answers, parse_hosts, render
from hypothesis import given
from hypothesis import strategies as st

from raven.protocol.names import canonical_node_name

V4 = ipaddress.ip_address("10.96.0.50")
V6 = ipaddress.ip_address("fd00::50")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("edge-gpu-7", "edge-gpu-7"),
        ("Edge-GPU-7", "edge-gpu-7"),
        ("node1.site-a.example", "node1.site-a.example"),
        ("a", "a"),
        ("0node", "0node"),
        ("a" * 63, "a" * 63),
        (".".join(["a" * 63] * 3) + "." + "b" * 61, ".".join(["a" * 63] * 3) + "." + "b" * 61),
        ("", None),
        ("a" * 64, None),
        (".".join(["a" * 63] * 4), None),  # 255 characters
        ("-edge", None),
        ("edge-", None),
        ("edge_gpu", None),
        ("edge gpu", None),
        ("edge..gpu", None),
        ("edge.", None),
        (".edge", None),
        ("edge-*", None),
        ("*.edge", None),
        ("10.0.0.1", None),
        ("host.123", None),
        ("édge", None),
        ("edge\n10.0.0.1 evil", None),
        ("edge#x", None),
    ],
)
def test_canonical_node_name(name: str, expected: str | None) -> None:
    assert canonical_node_name(name) == expected


def test_render_is_sorted_deterministic_and_dual_stack() -> None:
    snap = Snapshot(
        (
            Entry("edge-b", (V6, V4)),
            Entry("Edge-A", (V4, V6)),
            Entry("bad_name", (V4,)),
            Entry("edge-a", (ipaddress.ip_address("10.96.0.7"),)),  # merged with Edge-A
            Entry("lonely", ()),
        ),
        origin="test",
    )
    out = render(snap)
    assert out.text == (
        HEADER + "# source: test\n# names: 2, lines: 5\n"
        "10.96.0.7 edge-a\n10.96.0.50 edge-a\nfd00::50 edge-a\n"
        "10.96.0.50 edge-b\nfd00::50 edge-b\n"
    )
    assert out.invalid_names == ("bad_name",)
    assert out.unresolved_names == ("lonely",)
    assert out.lines == 5
    shuffled = Snapshot(tuple(reversed(snap.entries)), origin="test")
    assert render(shuffled).text == out.text


def test_render_header_cannot_be_broken_by_origin() -> None:
    out = render(Snapshot.uniform(["n"], [V4], origin="sel\n10.0.0.1 evil"))
    assert parse_hosts(out.text) == {"n": frozenset({V4})}
    assert "sel?10.0.0.1 evil" in out.text.splitlines()[1]


def test_render_empty() -> None:
    out = render(Snapshot((), origin="x"))
    assert parse_hosts(out.text) == {}
    assert "# names: 0, lines: 0" in out.text


def test_expected_answers_and_parse_roundtrip() -> None:
    out = render(Snapshot.uniform(["b", "a", "a"], [V4, V6], origin="o"))
    assert (
        parse_hosts(out.text)
        == expected_answers(out.entries)
        == {
            "a": frozenset({V4, V6}),
            "b": frozenset({V4, V6}),
        }
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10.0.0.1\n", "line 1: expected"),
        ("# c\nnot-an-ip host\n", "line 2: not an IP address"),
        ("10.0.0.1 bad_name\n", "invalid host name"),
        ("fe80::1%eth0 host\n", "zone"),
    ],
)
def test_parse_hosts_errors(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_hosts(text)


def test_parse_hosts_aliases_and_comments() -> None:
    text = "10.0.0.1 a b  # comment\n\n  fd00::1\ta\n"
    assert parse_hosts(text) == {
        "a": frozenset({ipaddress.ip_address("10.0.0.1"), ipaddress.ip_address("fd00::1")}),
        "b": frozenset({ipaddress.ip_address("10.0.0.1")}),
    }


@pytest.mark.parametrize("bad", [None, 7, "", "10.0.0", "10.0.0.1/24", "::g", "fe80::1%eth0"])
def test_parse_address_rejects(bad: object) -> None:
    with pytest.raises(InputError):
        parse_address(bad)


def test_debouncer_burst_becomes_one_deadline() -> None:
    d = Debouncer(quiet_s=0.25, max_delay_s=2.0)
    assert d.deadline() is None and not d.pending
    for i in range(10_000):
        d.changed(100.0 + i * 1e-5)  # 10k changes within 0.1 s
    assert d.deadline() == pytest.approx(100.0 + 9999e-5 + 0.25)
    assert not d.due(100.2) and d.due(100.36)
    d.fired()
    assert d.deadline() is None and not d.due(1e9)


def test_debouncer_max_delay_bounds_a_steady_trickle() -> None:
    d = Debouncer(quiet_s=0.25, max_delay_s=2.0)
    t = 0.0
    while t < 5.0 and not d.due(t):
        d.changed(t)
        t += 0.1
    assert t == pytest.approx(2.0, abs=0.11)


def test_debouncer_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="quiet_s"):
        Debouncer(quiet_s=3, max_delay_s=1)


names = st.text(alphabet=st.sampled_from("abcXYZ019-._*\n é"), max_size=80)


@given(names)
def test_normalize_name_fuzz(name: str) -> None:
    result = canonical_node_name(name)
    if result is not None:
        assert result == name.lower() and len(result) <= 253
        assert all(1 <= len(label) <= 63 for label in result.split("."))
        assert canonical_node_name(result) == result


@given(st.lists(st.tuples(names, st.sampled_from([V4, V6])), max_size=30))
def test_render_only_writes_valid_names_and_parses_back(pairs: list[tuple[str, object]]) -> None:
    snap = Snapshot(tuple(Entry(n, (a,)) for n, a in pairs), origin="fuzz")  # type: ignore[arg-type]
    out = render(snap)
    parsed = parse_hosts(out.text)
    assert parsed == expected_answers(out.entries)
    assert set(out.invalid_names) == {n for n, _ in pairs if canonical_node_name(n) is None}


@given(st.text(max_size=300))
def test_parse_hosts_fuzz(text: str) -> None:
    try:
        parsed = parse_hosts(text)
    except InputError:
        return
    for name in parsed:
        assert canonical_node_name(name) == name
