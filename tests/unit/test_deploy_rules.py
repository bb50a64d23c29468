"""The chart's PrometheusRule: its rules pass ``promtool check rules`` and every alert fires
(and stays quiet) as intended under ``promtool test rules`` on synthetic series; the plain
Prometheus job docs/kubernetes.md gives passes ``promtool check config``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.helpers import require
from tests.helpers.chart import kube_prometheus_stack, render
from tests.helpers.deploy import ROOT

PROMTOOL = "/usr/bin/promtool"  # the prometheus Debian package (scripts/setup)

#: promtool unit tests: each alert fires on series that should page, not on healthy ones.
RULE_TESTS = ROOT / "tests" / "fixtures" / "raven-alerts.test.yaml"


def rules_file(tmp_path: Path) -> Path:
    (rule,) = [o for o in render(kube_prometheus_stack()) if o["kind"] == "PrometheusRule"]
    path = tmp_path / "raven-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    return path


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    require(shutil.which(PROMTOOL) is not None, f"{PROMTOOL} missing (scripts/setup installs it)")
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def test_promtool_check_rules(tmp_path: Path) -> None:
    out = promtool("check", "rules", str(rules_file(tmp_path)))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 6 rules found" in out.stdout + out.stderr


def test_every_alert_fires_as_intended(tmp_path: Path) -> None:
    rules = rules_file(tmp_path)
    doc = yaml.safe_load(RULE_TESTS.read_text())
    assert doc["rule_files"] == [rules.name]
    tests = tmp_path / RULE_TESTS.name
    tests.write_text(RULE_TESTS.read_text())
    out = promtool("test", "rules", str(tests))
    assert out.returncode == 0, out.stdout + out.stderr
    tested = {t["alertname"] for t in doc["tests"][0]["alert_rule_test"]}
    (rule,) = [o for o in render(kube_prometheus_stack()) if o["kind"] == "PrometheusRule"]
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert tested == alerts, "every alert has a promtool test"


def test_documented_edge_job_passes_promtool_check_config(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    block = text.split("<!-- prometheus: edge job -->\n```yaml\n", 1)[1].split("```", 1)[0]
    jobs = yaml.safe_load(block)
    assert jobs[0]["proxy_url"].endswith(":10264") and "http_sd_configs" in jobs[0]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": jobs}))
    out = promtool("check", "config", "--syntax-only", str(config))
    assert out.returncode == 0, out.stdout + out.stderr
