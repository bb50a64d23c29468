"""Scrape learning and the local-scrape decisions (sans-IO, hand-driven clock)."""

from __future__ import annotations

from edge_agent.backfill.learn import (
    RequestSeen,
    RequestSniffer,
    Target,
    TargetTable,
    parse_request_head,
)

HEAD = (
    b"GET /metrics?x=1 HTTP/1.1\r\nHost: edge-gpu-1:9400\r\nUser-Agent: Prometheus/2.42.0\r\n"
    b"Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n"
    b"Accept-Encoding: gzip\r\nX-Prometheus-Scrape-Timeout-Seconds: 1.5\r\n\r\n"
)


def test_request_head_parsed() -> None:
    seen = parse_request_head("edge-gpu-1", 9400, HEAD[:-4])
    assert seen == RequestSeen(
        "edge-gpu-1",
        9400,
        "/metrics?x=1",
        "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        1.5,
    )


def test_absolute_form_and_non_get() -> None:
    seen = parse_request_head("n", 1, b"GET http://n:1/m HTTP/1.1\r\nHost: n:1")
    assert seen is not None and seen.path == "/m"
    assert parse_request_head("n", 1, b"POST /m HTTP/1.1\r\n") is None
    assert parse_request_head("n", 1, b"\x00\xff garbage") is None
    bad_timeout = parse_request_head(
        "n", 1, b"GET / HTTP/1.1\r\nX-Prometheus-Scrape-Timeout-Seconds: nan-ish"
    )
    assert bad_timeout is not None and bad_timeout.timeout_s is None


def test_sniffer_fed_one_byte_at_a_time() -> None:
    got: list[RequestSeen] = []
    sniffer = RequestSniffer("edge-gpu-1", 9400, got.append)
    done = [sniffer.feed(HEAD[i : i + 1]) for i in range(len(HEAD))]
    assert not any(done)  # it keeps watching: a kept stream carries the next scrape too
    assert [g.path for g in got] == ["/metrics?x=1"]


def test_sniffer_sees_every_request_of_a_kept_stream() -> None:
    got: list[RequestSeen] = []
    sniffer = RequestSniffer("edge-gpu-1", 9400, got.append)
    second = b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n"
    assert not sniffer.feed(HEAD + second[:10])
    assert not sniffer.feed(second[10:] + HEAD)
    assert [g.path for g in got] == ["/metrics?x=1", "/other", "/metrics?x=1"]


def test_sniffer_gives_up_on_huge_heads() -> None:
    got: list[RequestSeen] = []
    sniffer = RequestSniffer("n", 1, got.append)
    assert not sniffer.feed(b"GET / HTTP/1.1\r\nX: " + b"a" * 4000)
    assert sniffer.feed(b"a" * 5000)
    assert got == []


def seen(path: str = "/metrics") -> RequestSeen:
    return RequestSeen("edge-gpu-1", 9400, path, "text/plain", 1.0)


def table() -> TargetTable:
    return TargetTable(max_targets=4, forget_after_s=100.0, keep_while_down_s=1000.0)


def test_interval_learned_from_arrivals() -> None:
    t = table()
    for now in (1000.0, 1002.0, 1004.01, 1005.99):
        t.observe(seen(), now)
    target = t.targets[("edge-gpu-1", 9400, "/metrics", "")]
    assert target.interval_s is not None and abs(target.interval_s - 2.0) < 0.02
    assert target.timeout_s == 1.0 and target.accept == "text/plain"


def test_blackhole_local_scrapes_on_phase_then_handover() -> None:
    t = table()
    for now in (1000.0, 1002.0, 1004.0):
        t.observe(seen(), now)
    # tunnel still believed up: half an interval of grace after the missed slot at 1006
    assert t.due(1006.5, tunnel_up=True) == []
    due = t.due(1007.0, tunnel_up=True)
    assert [d.path for d in due] == ["/metrics"] and due[0].local
    assert due[0].next_slot == 1008.0
    assert t.due(1007.9, tunnel_up=False) == []
    assert len(t.due(1008.0, tunnel_up=False)) == 1
    assert len(t.due(1010.05, tunnel_up=False)) == 1
    # Prometheus is back at its own phase: local mode ends, local scrapes from 1011 on go
    served = t.observe(seen(), 1012.0)
    assert served is not None and served.delete_local_from == 1011.0
    assert not served.target.local
    assert t.due(1013.0, tunnel_up=True) == []


def test_tunnel_down_means_no_grace() -> None:
    t = table()
    for now in (1000.0, 1002.0):
        t.observe(seen(), now)
    assert len(t.due(1004.0, tunnel_up=False)) == 1


def test_missed_slots_are_not_made_up() -> None:
    t = table()
    for now in (1000.0, 1002.0):
        t.observe(seen(), now)
    assert len(t.due(1010.3, tunnel_up=False)) == 1  # e.g. the agent restarted just now
    target = t.targets[("edge-gpu-1", 9400, "/metrics", "")]
    assert target.next_slot == 1012.0


def test_table_is_bounded_and_forgets() -> None:
    t = table()
    for i in range(6):
        t.observe(seen(f"/m{i}"), 1000.0)
        t.observe(seen(f"/m{i}"), 1002.0)
    assert len(t.targets) == 4 and t.refused == 4
    # Prometheus stopped scraping while the tunnel is up: forgotten after forget_after_s
    t.due(1103.0, tunnel_up=True)
    assert t.targets == {}
    assert sorted(t.forgotten) == [("edge-gpu-1", 9400, f"/m{i}", "") for i in range(4)]


def test_kept_while_down_and_explicit_targets() -> None:
    t = table()
    t.add_explicit(Target("edge-gpu-2", 9100, "/metrics", "", 5.0, 15.0))
    # never scraped by Prometheus: nothing to fill while the tunnel is up...
    assert t.due(2000.0, tunnel_up=True) == []
    # ...but scraped during an outage
    assert len(t.due(2000.0, tunnel_up=False)) == 1
    t.observe(seen(), 1000.0)
    t.observe(seen(), 1002.0)
    assert len(t.due(1999.0, tunnel_up=False)) == 1  # down: kept up to keep_while_down_s


def test_explicit_overrides_learned() -> None:
    t = table()
    t.observe(seen(), 1000.0)
    t.observe(seen(), 1002.0)
    t.add_explicit(Target("edge-gpu-1", 9400, "/metrics", "", 3.0, 10.0))
    t.observe(seen(), 1004.0)
    target = t.targets[("edge-gpu-1", 9400, "/metrics", "")]
    assert target.interval_s == 10.0 and target.timeout_s == 3.0 and target.explicit


def test_restore_skips_unlearned_and_stale_targets() -> None:
    t = table()
    t.restore(
        [
            Target("a", 1, "/", interval_s=2.0, last_seen=1500.0),
            Target("b", 1, "/", interval_s=None, last_seen=1500.0),
            Target("c", 1, "/", interval_s=2.0, last_seen=100.0),  # idle beyond keep_while_down_s
        ],
        now=1600.0,
    )
    assert sorted(t.targets) == [("a", 1, "/", "")]
