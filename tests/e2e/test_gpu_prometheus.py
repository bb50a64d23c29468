"""A real Prometheus scrapes the GPU exporter (simulated GPUs) over loopback, and evaluates what
prometheus-adapter and Grafana dashboard 12239 would ask:

- every sharing profile (exclusive, time-slicing, MIG, ACK GPU sharing), in ACK label mode with
  ACK's five adapter rules verbatim (deploy/prometheus-adapter/ack-adapter-rules.yaml) and in the
  default label mode with our own rules (gpu-adapter-rules.yaml): every rule returns a value for
  every pod that uses a GPU, and each pod's memory ratio is its own used / allocated;
- every panel query of dashboard 12239 returns data for every simulated GPU model.

The rules' templates are filled as prometheus-adapter fills them for a custom-metrics request:
``<<.Series>>`` the series name, ``<<.LabelMatchers>>`` the resource's label matchers (namespace
equality and pod names as a regex, or the node name), ``<<.GroupBy>>`` the resource's label.
All exporters run in one process (`RUNNER`), each on its own port with its own node name.

Skips when prometheus is not installed, unless RAVEN_REQUIRE_E2E=1 (then it fails).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.simulated import MODELS, SHARING_MODES, SimulatedBackend, tenants_of
from tests.helpers import free_ports, require
from tests.helpers.e2e.prometheus import api_data, static_job, vector

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
ADAPTER = REPO / "deploy" / "prometheus-adapter"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
GPUS = 2
RUNNER = """
import argparse, asyncio, json, signal, sys
from gpu_exporter import cli

async def main(specs):
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    exporters = [cli.build_exporter(parser.parse_args(argv)) for argv in specs]
    for exporter in exporters:
        await exporter.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for exporter in exporters:
        await exporter.stop()

asyncio.run(main(json.loads(sys.argv[1])))
"""


@dataclass(frozen=True)
class Node:
    """One simulated GPU node: an exporter with its own node name, seed and port."""

    name: str
    model: str
    sharing: str
    label_mode: str
    seed: int
    port: int = 0

    def argv(self, host: str) -> list[str]:
        return [
            "gpu-exporter", "--simulate", str(GPUS), "--model", self.model, "--seed",
            str(self.seed), "--sharing", self.sharing, "--label-mode", self.label_mode,
            "--hostname", self.name, "-k", "-a", f"{host}:{self.port}", "-c", "1000",
        ]  # fmt: skip

    def backend(self) -> SimulatedBackend:
        return SimulatedBackend(GPUS, model=self.model, seed=self.seed, sharing=self.sharing)


def nodes() -> list[Node]:
    out = [
        Node(f"gpu-{sharing}-{mode}", "H100", sharing, mode, seed)
        for seed, (mode, sharing) in enumerate(
            ((m, s) for m in ("ack", "upstream") for s in SHARING_MODES), start=10
        )
    ]
    out += [
        Node(f"gpu-{model.lower()}", model, "exclusive", "upstream", seed)
        for seed, model in enumerate(sorted(MODELS), start=40)
    ]
    return out


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


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require(os.path.exists(PROMETHEUS), f"prometheus not installed at {PROMETHEUS} (scripts/setup)")
    tmp = tmp_path_factory.mktemp("gpu-prom")
    host = loopback_host()
    *ports, prom_port = free_ports(len(nodes()) + 1, host)  # distinct: one exporter each
    fleet = [
        Node(n.name, n.model, n.sharing, n.label_mode, n.seed, port)
        for n, port in zip(nodes(), ports, strict=True)
    ]
    exporters = subprocess.Popen(
        [sys.executable, "-c", RUNNER, json.dumps([n.argv(host) for n in fleet])],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    prom: subprocess.Popen[bytes] | None = None
    try:
        for n in fleet:
            wait_http(f"http://{host}:{n.port}/readyz", exporters, 30)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                static_job("dcgm", [f"{host}:{n.port}" for n in fleet], scrape_interval="1s")
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address={host}:{prom_port}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        base = f"http://{host}:{prom_port}"
        wait_http(f"{base}/-/ready", prom, 30)
        wait_for(base, f'count(up{{job="dcgm"}} == 1) == {len(fleet)}')
        wait_for(base, f"count(count by (instance) (DCGM_FI_DEV_GPU_TEMP)) == {len(fleet)}")
        yield {"prom": base, "host": host, "nodes": fleet}
    finally:
        if prom is not None:
            stop(prom)
        stop(exporters)


def query(base: str, promql: str) -> list[dict[str, Any]]:
    target = "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    return vector(promql, api_data(target, 200, http_get(base + target)))


def wait_for(base: str, promql: str, deadline_s: float = 60.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        result = query(base, promql)
        if result:
            return result
        time.sleep(0.5)
    pytest.fail(f"no data for {promql} after {deadline_s}s")


# ---- prometheus-adapter's view ------------------------------------------------------------


def rules(name: str) -> list[dict[str, Any]]:
    (cm,) = [d for d in yaml.safe_load_all((ADAPTER / name).read_text()) if d]
    return list(yaml.safe_load(cm["data"]["config.yaml"])["rules"])


def resource_labels(rule: dict[str, Any]) -> dict[str, str]:
    """Kubernetes resource -> the series label the rule maps it from."""
    return {v["resource"]: k for k, v in rule["resources"]["overrides"].items()}


def fill(rule: dict[str, Any], matchers: str, group_by: str) -> str:
    series = re.split(r"[{\s]", rule["seriesQuery"].strip("'"), maxsplit=1)[0]
    return (
        rule["metricsQuery"]
        .replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", matchers)
        .replace("<<.GroupBy>>", group_by)
    )


def pods_of(node: Node) -> dict[tuple[str, str], tuple[int, int]]:
    """(namespace, pod) -> (memory used, memory allocated) summed over the pod's GPUs."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for t in tenants_of(node.backend()):
        used, allocated = out.get((t.pod.namespace, t.pod.pod), (0, 0))
        out[(t.pod.namespace, t.pod.pod)] = (used + t.used_mib, allocated + t.allocated_mib)
    return out


def discovers(base: str, rule: dict[str, Any], node: Node) -> bool:
    """Whether the rule's seriesQuery finds series of this node (the adapter's discovery)."""
    series = rule["seriesQuery"].strip("'").split("#", 1)[0].strip()
    url = f"{base}/api/v1/series?" + urllib.parse.urlencode({"match[]": series})
    found = json.loads(http_get(url))["data"]
    return any(node.name in s.values() for s in found)


def check_rules(base: str, node: Node, rule_file: str) -> int:
    """Evaluate every rule of the file for the node and for each of its pods; the number of
    (rule, object) answers checked."""
    pods = pods_of(node)
    assert pods, node
    checked = 0
    for rule in rules(rule_file):
        labels = resource_labels(rule)
        if not discovers(base, rule, node):
            continue  # the adapter registers no metric from a rule whose series do not exist
        is_ratio = "RATIO" in rule.get("name", {}).get("as", "")
        if "pod" not in labels:
            node_label = labels["node"]
            promql = fill(rule, f'{node_label}="{node.name}"', node_label)
            (result,) = query(base, promql)
            assert result["metric"][node_label] == node.name, promql
            assert float(result["value"][1]) >= 0, promql
            checked += 1
            continue
        ns_label, pod_label = labels["namespace"], labels["pod"]
        for namespace in sorted({ns for ns, _ in pods}):
            names = sorted(p for ns, p in pods if ns == namespace)
            matchers = f'{ns_label}="{namespace}",{pod_label}=~"{"|".join(names)}"'
            promql = fill(rule, matchers, pod_label)
            got = {r["metric"][pod_label]: float(r["value"][1]) for r in query(base, promql)}
            assert sorted(got) == names, (node.name, promql, got)
            for name, value in got.items():
                if is_ratio:
                    used, allocated = pods[(namespace, name)]
                    assert value == pytest.approx(used / allocated, rel=1e-9), (name, promql)
                    assert 0 < value <= 1
                else:
                    assert value >= 0
                checked += 1
    return checked


@pytest.mark.parametrize("sharing", SHARING_MODES)
def test_ack_rules_verbatim_in_ack_label_mode(stack: dict[str, Any], sharing: str) -> None:
    (node,) = [n for n in stack["nodes"] if n.sharing == sharing and n.label_mode == "ack"]
    pods = len(pods_of(node))
    assert pods == {"exclusive": 2, "time-slicing": 6, "mig": 4, "ack-share": 6}[sharing]
    # 2 node rules + 3 pod rules for every pod
    assert check_rules(stack["prom"], node, "ack-adapter-rules.yaml") == 2 + 3 * pods


@pytest.mark.parametrize("sharing", SHARING_MODES)
def test_our_rules_in_upstream_label_mode(stack: dict[str, Any], sharing: str) -> None:
    (node,) = [n for n in stack["nodes"] if n.name == f"gpu-{sharing}-upstream"]
    assert check_rules(stack["prom"], node, "gpu-adapter-rules.yaml") == 2 + 3 * len(pods_of(node))


def dashboard_queries(sel: str) -> list[str]:
    """The panel queries of Grafana dashboard 12239 (NVIDIA DCGM Exporter Dashboard)."""
    return [
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


@pytest.mark.parametrize("model", sorted(MODELS))
def test_dashboard_12239_for_every_model(stack: dict[str, Any], model: str) -> None:
    base = stack["prom"]
    (node,) = [n for n in stack["nodes"] if n.name == f"gpu-{model.lower()}"]
    inst = f"{stack['host']}:{node.port}"
    # Dashboard variables: label_values(DCGM_FI_DEV_GPU_TEMP, instance) and (..., gpu).
    values = json.loads(
        http_get(
            f"{base}/api/v1/label/gpu/values?"
            + urllib.parse.urlencode({"match[]": f'DCGM_FI_DEV_GPU_TEMP{{instance="{inst}"}}'})
        )
    )
    assert values["data"] == ["0", "1"]
    sel = f'instance=~"{inst}", gpu=~"0|1"'
    for q in dashboard_queries(sel):
        result = query(base, q)
        assert sorted(r["metric"]["gpu"] for r in result) == ["0", "1"], q
        assert all(r["metric"]["modelName"] == MODELS[model].name for r in result), q
    for q in (f"avg(DCGM_FI_DEV_GPU_TEMP{{{sel}}})", f"sum(DCGM_FI_DEV_POWER_USAGE{{{sel}}})"):
        (r,) = query(base, q)
        assert float(r["value"][1]) > 0, q
    # Under training load the SM clock is the model's clock under load.
    clocks = query(base, f"DCGM_FI_DEV_SM_CLOCK{{{sel}}} * 1000000")
    assert {float(r["value"][1]) for r in clocks} == {MODELS[model].load_sm_clock_mhz * 1e6}
    # Counters keep dcgm-exporter's bare names and work with rate().
    (energy,) = wait_for(
        base, f'sum(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{instance="{inst}"}}[30s])) > 0'
    )
    assert float(energy["value"][1]) > 0
