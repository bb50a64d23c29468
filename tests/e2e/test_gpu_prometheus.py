"""A real Prometheus scrapes the GPU exporter (simulated GPUs) over loopback; every query of
Grafana dashboard 12239 and every prometheus-adapter rule in deploy/ returns data.

Skips when prometheus is not installed, unless RAVEN_REQUIRE_E2E=1 (then it fails).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import free_port, require

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
HOSTNAME = "edge-gpu-e2e"
RUNNER = (
    "import sys, argparse\nfrom gpu_exporter import cli\np = argparse.ArgumentParser()\n"
    "cli.register(p.add_subparsers())\na = p.parse_args(sys.argv[1:])\nsys.exit(a.func(a))\n"
)


def require_prometheus() -> None:
    require(os.path.exists(PROMETHEUS), f"prometheus not installed at {PROMETHEUS} (scripts/setup)")


def loopback_host() -> str:
    """A 127.0.0.x address picked per run, so parallel runs do not collide."""
    host = f"127.0.0.{2 + os.getpid() % 200}"
    try:
        with socket.socket() as s:
            s.bind((host, 0))
    except OSError:
        return "127.0.0.1"
    return host


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return bytes(r.read())


def wait_http(url: str, proc: subprocess.Popen[bytes], deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            pytest.fail(f"process exited early ({proc.returncode}): {out[-2000:]}")
        try:
            http_get(url, timeout=1)
            return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"{url} not answering after {deadline_s}s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, str]]:
    require_prometheus()
    host = loopback_host()
    exporter_port, prom_port = free_port(host), free_port(host)
    exporter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            RUNNER,
            "gpu-exporter",
            "--simulate",
            "2",
            "--seed",
            "0",
            "--load-profile",
            "training",
            "-a",
            f"{host}:{exporter_port}",
            "-c",
            "500",
            "--hostname",
            HOSTNAME,
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    prom: subprocess.Popen[bytes] | None = None
    try:
        wait_http(f"http://{host}:{exporter_port}/health", exporter, 20)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "dcgm",
                    "scrape_interval": "1s",
                    "static_configs": [{"targets": [f"{host}:{exporter_port}"]}],
                }
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address={host}:{prom_port}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        base = f"http://{host}:{prom_port}"
        wait_http(f"{base}/-/ready", prom, 30)
        yield {"prom": base, "instance": f"{host}:{exporter_port}"}
    finally:
        if prom is not None:
            stop(prom)
        stop(exporter)


def query(base: str, promql: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    answer = json.loads(http_get(url))
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def wait_for(base: str, promql: str, deadline_s: float = 40.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        result = query(base, promql)
        if result:
            return result
        time.sleep(0.5)
    pytest.fail(f"no data for {promql} after {deadline_s}s")


def test_dashboard_12239_and_adapter_rules(stack: dict[str, str]) -> None:
    base, inst = stack["prom"], stack["instance"]
    up = wait_for(base, 'up{job="dcgm"} == 1')
    assert up[0]["metric"]["instance"] == inst
    wait_for(base, "count_over_time(DCGM_FI_DEV_GPU_TEMP[1m]) >= 2")

    # Dashboard variables: label_values(DCGM_FI_DEV_GPU_TEMP, instance) and (..., gpu).
    values = json.loads(
        http_get(
            f"{base}/api/v1/label/gpu/values?"
            + urllib.parse.urlencode({"match[]": "DCGM_FI_DEV_GPU_TEMP"})
        )
    )
    assert values["data"] == ["0", "1"]
    sel = f'instance=~"{inst}", gpu=~"0|1"'
    per_gpu = [
        f"DCGM_FI_DEV_GPU_TEMP{{{sel}}}",
        f"DCGM_FI_DEV_POWER_USAGE{{{sel}}}",
        f"DCGM_FI_DEV_SM_CLOCK{{{sel}}} * 1000000",
        f"DCGM_FI_DEV_MEM_CLOCK{{{sel}}} * 1000000",
        f"DCGM_FI_DEV_GPU_UTIL{{{sel}}}",
        f"DCGM_FI_DEV_MEM_COPY_UTIL{{{sel}}}",
        f"DCGM_FI_DEV_FB_USED{{{sel}}}",
        f"DCGM_FI_DEV_FB_FREE{{{sel}}}",
        f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{sel}}}",
    ]
    for q in per_gpu:
        result = query(base, q)
        assert sorted(r["metric"]["gpu"] for r in result) == ["0", "1"], q
        assert all(r["metric"]["instance"] == inst for r in result), q
    totals = [f"avg(DCGM_FI_DEV_GPU_TEMP{{{sel}}})", f"sum(DCGM_FI_DEV_POWER_USAGE{{{sel}}})"]
    for q in totals:
        (r,) = query(base, q)
        assert float(r["value"][1]) > 0, q
    # Simulated H100s under training run at their max SM clock: 1980 MHz.
    clocks = query(base, f"DCGM_FI_DEV_SM_CLOCK{{{sel}}} * 1000000")
    assert {float(r["value"][1]) for r in clocks} == {1.98e9}
    temps = query(base, "DCGM_FI_DEV_GPU_TEMP")
    assert all(
        r["metric"]["Hostname"] == HOSTNAME and r["metric"]["modelName"] == "NVIDIA H100 80GB HBM3"
        for r in temps
    )
    # Counters keep dcgm-exporter's bare names and work with rate().
    (energy,) = query(
        base, f'sum(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{instance="{inst}"}}[30s]))'
    )
    assert float(energy["value"][1]) > 0

    # prometheus-adapter rules from deploy/, with the adapter's template filled in.
    cm = yaml.safe_load(
        (REPO / "deploy" / "prometheus-adapter" / "gpu-adapter-rules.yaml").read_text()
    )
    rules = yaml.safe_load(cm["data"]["config.yaml"])["rules"]
    for rule in rules:
        series = rule["seriesQuery"].split("{", 1)[0].strip("'")
        overrides = rule["resources"]["overrides"]
        if "PodName" in overrides:
            matchers, group = 'NamespaceName="ml",PodName=~"train-0-0|train-0-1"', "PodName"
        else:
            matchers, group = f'Hostname="{HOSTNAME}"', "Hostname"
        promql = (
            rule["metricsQuery"]
            .replace("<<.Series>>", series)
            .replace("<<.LabelMatchers>>", matchers)
            .replace("<<.GroupBy>>", group)
        )
        result = query(base, promql)
        assert result, promql
        for r in result:
            v = float(r["value"][1])
            assert v > 0, promql
            if "RATIO" in rule.get("name", {}).get("as", ""):
                assert 0 < v <= 1, promql
