"""The status document's parts: quantiles, the bounded scrape log, the terminal tables."""

from __future__ import annotations

import cloud_gateway.status as status
from cloud_gateway.status import ScrapeLog, quantile
from raven.telemetry.status_table import fmt_ms, render_status


def test_quantile_nearest_rank() -> None:
    assert quantile([], 0.5) is None
    assert quantile([3.0], 0.99) == 3.0
    values = [float(i) for i in range(1, 101)]
    assert quantile(values, 0.5) == 50.0
    assert quantile(values, 0.99) == 99.0
    assert quantile(list(reversed(values)), 0.99) == 99.0


def test_scrape_log_records_results_and_errors() -> None:
    now = [1000.0]
    log = ScrapeLog(clock=lambda: now[0])
    log.ok("edge-1", 200, 0.004)
    now[0] += 5
    log.failed("edge-1", "target_refused", 502, "connection refused")
    log.failed("nope-1", "unknown_node", 404, "no such node")
    state = log.nodes["edge-1"]
    assert (state.ok, state.failed, state.last_result, state.last_status) == (
        1, 1, "target_refused", 502)  # fmt: skip
    assert list(state.durations) == [0.004]
    assert "nope-1" not in log.nodes  # unknown names get no per-node state (unbounded)
    assert log.errors["unknown_node"].count == 1
    assert [e["reason"] for e in log.recent] == ["unknown_node", "target_refused"]


def test_scrape_log_is_bounded(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(status, "MAX_NODES", 3)
    log = ScrapeLog()
    for i in range(10):
        log.ok(f"edge-{i}", 200, 0.001)
    assert list(log.nodes) == ["edge-7", "edge-8", "edge-9"]
    for _ in range(status.RECENT_ERRORS * 2):
        log.failed("edge-9", "timeout", 504)
    assert len(log.recent) == status.RECENT_ERRORS


def test_fmt_ms_has_sub_millisecond_resolution() -> None:
    assert fmt_ms(0.00042) == "0.42 ms"
    assert fmt_ms(0.0123) == "12.3 ms"
    assert fmt_ms(0.25) == "250 ms"
    assert fmt_ms(None) == "-"


def test_render_status_tables() -> None:
    data = {
        "gateway": {"version": "0.2.0", "uptime_seconds": 75.0},
        "agents": [{"site": "site-a", "state": "up", "agent_key": "AbCdEf12",
                    "address": "10.0.0.1:5000", "rtt_seconds": 0.00042, "uptime_seconds": 61.0,
                    "bytes_sent": 2048, "bytes_received": 10, "open_streams": 1, "nodes": 2}],
        "nodes": [{"node": "site-a-gpu-1", "site": "site-a", "reachable": True,
                   "last_scrape": "x", "last_scrape_age_seconds": 1.5, "result": "ok",
                   "status": 200, "latency_p50_seconds": 0.004, "latency_p99_seconds": 0.012,
                   "scrapes_ok": 3, "scrapes_failed": 0, "last_error": None}],
        "errors": [],
    }  # fmt: skip
    text = render_status(data)
    lines = text.splitlines()
    assert lines[0] == "gateway 0.2.0, up 1m15s: 1/1 agents up, 1/1 nodes reachable"
    assert lines[2].split() == ["SITE", "STATE", "KEY", "ADDRESS", "RTT", "UPTIME", "SENT",
                                "RECEIVED", "STREAMS", "NODES"]  # fmt: skip
    assert "site-a  up     AbCdEf12  10.0.0.1:5000  0.42 ms" in lines[3]
    assert "2.0 KiB" in lines[3]
    assert "site-a-gpu-1  site-a  1.5s ago     ok 200  4.00 ms  12.0 ms" in text
    assert text.endswith("no errors\n")


def test_a_node_of_a_down_site_names_the_site() -> None:
    node = {"node": "site-b-gpu-1", "site": "site-b", "reachable": False, "last_scrape": None,
            "last_scrape_age_seconds": None, "result": None, "status": None,
            "latency_p50_seconds": None, "latency_p99_seconds": None, "scrapes_ok": 0,
            "scrapes_failed": 0, "last_error": None}  # fmt: skip
    text = render_status({"gateway": {}, "agents": [], "nodes": [node], "errors": []})
    assert "site-b-gpu-1  site-b (down)  never" in text
    orphan = {**node, "site": None}
    text = render_status({"gateway": {}, "agents": [], "nodes": [orphan], "errors": []})
    assert "site-b-gpu-1  (no agent)  never" in text


def test_backfill_line_per_site() -> None:
    from raven.telemetry.status_table import backfill_table

    backfill = {"batches": 3, "samples_written": 1200,
                "samples_dropped": {"too_old": 2, "not_served": 1}, "last_batch": 1000.0,
                "last_error": "", "agent_buffered_samples": 40.0,
                "agent_buffered_bytes": 4096.0, "agent_oldest_buffered_ms": 990_000,
                "last_batch_age_seconds": 2.0, "oldest_buffered_age_seconds": 12.0}  # fmt: skip
    agents = [{"site": "site-a", "backfill": backfill}, {"site": "site-b", "backfill": None}]
    lines = backfill_table(agents).splitlines()
    assert lines[0].split()[:2] == ["SITE", "BUFFERED"]
    assert len(lines) == 2  # site-b never backfilled: no line
    assert lines[1].split() == ["site-a", "40", "4.0", "KiB", "12.0s", "1200", "3", "2.0s", "ago"]
    assert backfill_table([{"site": "site-b", "backfill": None}]) == ""
    agent = {"state": "up", "agent_key": "AbCdEf12", "address": None, "rtt_seconds": None,
             "uptime_seconds": None, "bytes_sent": 0, "bytes_received": 0, "open_streams": 0,
             "nodes": 0, **agents[0]}  # fmt: skip
    data = {"gateway": {}, "agents": [agent], "nodes": [], "errors": []}
    assert "backfill (samples an agent stored" in render_status(data)


def test_backfill_status_ages_come_from_the_gateway_clock() -> None:
    from cloud_gateway.backfill.receiver import AgentBackfillStatus

    st = AgentBackfillStatus(
        last_batch=100.0, buffered={"samples": 5, "bytes": 80, "oldest_ts_ms": 40_000}
    )
    doc = st.to_json(now=130.0)
    assert doc["last_batch_age_seconds"] == 30.0
    assert doc["oldest_buffered_age_seconds"] == 90.0
    assert AgentBackfillStatus().to_json(now=5.0)["oldest_buffered_age_seconds"] is None
