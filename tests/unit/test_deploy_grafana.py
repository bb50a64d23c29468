"""The Grafana dashboards in deploy/grafana/, checked against the metrics the code really defines.

Every metric a query names must exist on one of the metric classes (instantiated on a private
registry), with every label the query matches on or groups by; rate()/increase() only on
counters and histogram series. No PromQL engine runs here: expressions are checked for balanced
brackets and for these rules, not evaluated.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.metrics import defined_metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "raven-tunnel.json"

#: The tunnel-side metrics the dashboard must show (issue 7).
REQUIRED = {
    "raven_event_loop_lag_seconds",
    "raven_tunnels_connected",
    "raven_handshakes_total",
    "raven_tunnel_bytes_total",
    "raven_tunnel_frames_total",
    "raven_streams_open",
    "raven_stream_resets_total",
    "raven_tunnel_rtt_seconds",
    "raven_registrations_refused_total",
    "raven_proxy_request_duration_seconds",
    "raven_proxy_errors_total",
    "raven_proxy_requests_total",
    "raven_l3_packets_total",
    "raven_l3_drops_total",
    "raven_hosts_writes_total",
}
#: Labels Prometheus attaches to every scraped series.
TARGET_LABELS = {"instance", "job"}
FUNCS_NEEDING_COUNTERS = ("rate", "irate", "increase")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (p["title"], t["expr"])
        for p in dashboard["panels"]
        if p["type"] != "row"
        for t in p["targets"]
    ]


_SELECTOR = re.compile(r"\b(raven_[a-z0-9_]+)(\{[^}]*\})?")
_BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def test_all_required_metrics_are_on_the_dashboard(dashboard: dict[str, Any]) -> None:
    used = {m for _t, e in queries(dashboard) for m, _ in _SELECTOR.findall(e)}
    bases = {re.sub(r"_(bucket|count|sum)$", "", m) for m in used}
    assert bases >= REQUIRED, f"missing: {sorted(REQUIRED - bases)}"


def test_every_metric_and_label_in_a_query_exists_in_the_code(dashboard: dict[str, Any]) -> None:
    metrics = defined_metrics()
    for title, expr in queries(dashboard):
        selectors = _SELECTOR.findall(expr)
        assert selectors, f"{title}: no raven metric in {expr}"
        available: set[str] = set(TARGET_LABELS)
        for name, matcher in selectors:
            assert name in metrics, f"{title}: {name} is not defined by any metric class"
            _kind, labels = metrics[name]
            available |= labels
            for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matcher):
                assert label in labels | TARGET_LABELS, f"{title}: {name} has no label {label}"
        for group in _BY.findall(expr):
            for label in filter(None, (x.strip() for x in group.split(","))):
                assert label in available, f"{title}: grouping by unknown label {label}"


def test_rate_only_on_counters_and_quantiles_on_buckets(dashboard: dict[str, Any]) -> None:
    metrics = defined_metrics()
    for title, expr in queries(dashboard):
        for func in FUNCS_NEEDING_COUNTERS:
            for m in re.finditer(rf"\b{func}\((raven_[a-z0-9_]+)", expr):
                kind = metrics[m.group(1)][0]
                assert kind in {"counter", "histogram_bucket"}, f"{title}: {func} of a {kind}"
        for m in re.finditer(r"histogram_quantile\(([0-9.]+),(.*)$", expr):
            assert 0 < float(m.group(1)) < 1
            assert "_bucket" in m.group(2) and re.search(r"by \([^)]*\ble\b", m.group(2)), title
        for name, _ in _SELECTOR.findall(expr):
            if metrics[name][0] in {"counter", "histogram_bucket"}:
                assert re.search(rf"(rate|increase)\({name}\b", expr), f"{title}: raw counter"


def test_expressions_are_balanced(dashboard: dict[str, Any]) -> None:
    pairs = {")": "(", "]": "[", "}": "{"}
    for title, expr in queries(dashboard):
        stack: list[str] = []
        for ch in re.sub(r'"[^"]*"', '""', expr):
            if ch in "([{":
                stack.append(ch)
            elif ch in pairs:
                assert stack and stack.pop() == pairs[ch], f"{title}: unbalanced {expr}"
        assert not stack, f"{title}: unbalanced {expr}"


def test_panels_have_unique_ids_a_datasource_variable_and_do_not_overlap(
    dashboard: dict[str, Any],
) -> None:
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps another panel"
                cells.add((x, y))
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert p["description"], p["title"]
            assert {t["refId"] for t in p["targets"]} == {
                chr(65 + i) for i in range(len(p["targets"]))
            }


def test_template_variables_used_are_defined(dashboard: dict[str, Any]) -> None:
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    builtin = {"__rate_interval", "__range", "__interval"}
    for title, expr in queries(dashboard):
        for var in re.findall(r"\$(\w+)", expr):
            assert var in defined | builtin, f"{title}: ${var} undefined"
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            metric = re.search(r"label_values\((\w+), (\w+)\)", v["query"]["query"])
            assert metric is not None
            assert metric.group(2) in defined_metrics()[metric.group(1)][1]


def test_dashboard_identity(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "raven-tunnel"
    assert "id" not in dashboard or dashboard["id"] is None  # importable into any Grafana
    readme = (ROOT / "deploy" / "grafana" / "README.md").read_text()
    assert "12239" in readme and DASHBOARD.name in readme


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool (Debian package prometheus) is not installed")
    return path


def as_promql(expr: str) -> str:
    """Grafana variables replaced by what Grafana would send."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__range", "1h")
    return re.sub(r"\$(\w+)", ".*", expr)


def test_every_query_parses_with_the_real_prometheus_parser(
    dashboard: dict[str, Any], tmp_path: Path
) -> None:
    """promtool checks each expression of a rules file with Prometheus's own PromQL parser."""
    exe = promtool()
    rules = [
        {"record": f"raven:dashboard_query_{i}", "expr": as_promql(expr)}
        for i, (_title, expr) in enumerate(queries(dashboard))
    ]
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        [exe, "check", "rules", str(rules_file)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_alert_examples_in_the_docs_parse(tmp_path: Path) -> None:
    exe = promtool()
    text = (ROOT / "docs" / "operations.md").read_text()
    block = text.split("Alert ideas:", 1)[1].split("```promql", 1)[1].split("```", 1)[0]
    exprs = [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert len(exprs) >= 5
    rules = [{"alert": f"Example{i}", "expr": e} for i, e in enumerate(exprs)]
    rules_file = tmp_path / "alerts.yml"
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "docs", "rules": rules}]}))
    result = subprocess.run(
        [exe, "check", "rules", str(rules_file)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_prometheus_config_is_valid_for_prometheus() -> None:
    exe = promtool()
    result = subprocess.run(
        [exe, "check", "config", str(ROOT / "compose" / "prometheus.yml")],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def panel_expr(dashboard: dict[str, Any], title: str) -> str:
    (expr,) = [e for t, e in queries(dashboard) if t == title]
    return as_promql(expr)


def test_key_panels_compute_the_right_numbers(dashboard: dict[str, Any], tmp_path: Path) -> None:
    """Evaluated by Prometheus's engine (promtool test rules) on synthetic series."""
    exe = promtool()
    series = [
        # gateway side: site-a up on both replicas, site-b down; the agent side (label gateway,
        # no agent label) must not count as an agent
        ('raven_tunnels_connected{agent="site-a",instance="gw-0"}', "1x10"),
        ('raven_tunnels_connected{agent="site-a",instance="gw-1"}', "1x10"),
        ('raven_tunnels_connected{agent="site-b",instance="gw-0"}', "0x10"),
        ('raven_tunnels_connected{gateway="10.0.0.5:10262",instance="agent-a"}', "1x10"),
        ('raven_proxy_errors_total{reason="no_agent",instance="gw-0"}', "0+60x10"),
        ('raven_proxy_errors_total{reason="no_agent",instance="gw-1"}', "0+60x10"),
        ('raven_proxy_errors_total{reason="port_not_allowed",instance="gw-0"}', "0+30x10"),
        ('raven_tunnel_rtt_seconds{agent="site-a",instance="gw-0"}', "0.002x10"),
    ]
    tests = [
        {
            "expr": panel_expr(dashboard, "Agents up"),
            "eval_time": "5m",
            "exp_samples": [{"labels": "{}", "value": 1}],
        },
        {
            "expr": panel_expr(dashboard, "Tunnels per agent"),
            "eval_time": "5m",
            "exp_samples": [
                {"labels": '{agent="site-a"}', "value": 2},
                {"labels": '{agent="site-b"}', "value": 0},
            ],
        },
        {
            "expr": panel_expr(dashboard, "Errors by reason"),
            "eval_time": "5m",
            "exp_samples": [
                {"labels": '{reason="no_agent"}', "value": 2},
                {"labels": '{reason="port_not_allowed"}', "value": 0.5},
            ],
        },
        {
            "expr": panel_expr(dashboard, "Tunnel RTT"),
            "eval_time": "5m",
            "exp_samples": [{"labels": '{agent="site-a",instance="gw-0"}', "value": 0.002}],
        },
    ]
    spec = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "promql_expr_test": tests,
            }
        ],
    }
    test_file = tmp_path / "test.yml"
    test_file.write_text(yaml.safe_dump(spec))
    result = subprocess.run(
        [exe, "test", "rules", str(test_file)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
