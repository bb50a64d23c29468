"""A real Prometheus server (Debian's /usr/bin/prometheus) inside a namespace, for e2e tests.

:class:`Prometheus` writes a config from scrape jobs, starts the server in a
:class:`~tests.helpers.e2e.netns.Netns` (through ``ip netns exec``, so the namespace's
/etc/netns/<ns>/resolv.conf is its DNS), and queries its HTTP API from the test process.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.e2e.netns import Lab, Netns, Proc, wait_until

PROMETHEUS_BIN = "/usr/bin/prometheus"


class PrometheusError(AssertionError):
    """Prometheus answered with an error, or what a test waited for did not happen."""


def duration(seconds: float) -> str:
    """A Prometheus duration (integer units only: ``1500ms``, not ``1.5s``)."""
    return f"{round(seconds * 1000)}ms"


def static_job(
    name: str,
    targets: Sequence[str],
    *,
    labels: Mapping[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A scrape job with static targets; ``extra`` goes into the job as is
    (``proxy_url``, ``relabel_configs``, ``metrics_path``...)."""
    group: dict[str, Any] = {"targets": list(targets)}
    if labels:
        group["labels"] = dict(labels)
    return {"job_name": name, "static_configs": [group], **extra}


def http_sd_job(name: str, url: str, *, refresh_s: float = 2.0, **extra: Any) -> dict[str, Any]:
    """A scrape job discovering its targets from an http_sd endpoint."""
    return {
        "job_name": name,
        "http_sd_configs": [{"url": url, "refresh_interval": duration(refresh_s)}],
        **extra,
    }


def api_data(target: str, status: int, body: bytes) -> Any:
    """The ``data`` of a Prometheus API answer to ``target``; PrometheusError for an error."""
    try:
        doc = json.loads(body)
    except ValueError:
        text = body.decode(errors="replace")
        raise PrometheusError(f"{target}: HTTP {status}: {text[:300]}") from None
    if status != 200 or doc.get("status") != "success":
        raise PrometheusError(f"{target}: HTTP {status}: {doc}")
    return doc["data"]


def vector(promql: str, data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The samples of an instant query's ``data``: ``{"metric": {...}, "value": [ts, "v"]}``."""
    if data.get("resultType") != "vector":
        raise PrometheusError(f"{promql}: expected a vector, got {data.get('resultType')}")
    return list(data["result"])


class Prometheus:
    """One Prometheus server in ``ns`` listening on ``listen`` (host:port inside ``ns``)."""

    def __init__(
        self,
        lab: Lab,
        ns: Netns,
        jobs: Sequence[Mapping[str, Any]],
        *,
        name: str = "prometheus",
        listen: str = "127.0.0.1:9090",
        scrape_interval_s: float = 2.0,
        scrape_timeout_s: float = 1.5,
        binary: str = PROMETHEUS_BIN,
        extra_config: Mapping[str, Any] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.lab = lab
        self.ns = ns
        self.name = name
        self.host, port = listen.rsplit(":", 1)
        self.port = int(port)
        self.dir = lab.workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.dir / "prometheus.yml"
        self.config: dict[str, Any] = {
            "global": {
                "scrape_interval": duration(scrape_interval_s),
                "scrape_timeout": duration(scrape_timeout_s),
                "evaluation_interval": "15s",
            },
            "scrape_configs": [dict(j) for j in jobs],
            **(extra_config or {}),
        }
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        self.proc: Proc = lab.process(
            ns,
            name,
            [
                binary,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address={listen}",
                "--web.enable-lifecycle",
                "--log.level=info",
                *extra_args,
            ],
            cwd=self.dir,
            start=False,
        )
        lab.diagnostic_hooks.append(self._diagnostics)

    def _diagnostics(self) -> str:
        if not self.proc.alive:
            return f"----- {self.name}: not running"
        return f"----- {self.name} /api/v1/targets\n{self.targets_summary()}"

    def start(self, timeout_s: float = 20.0) -> Prometheus:
        self.proc.start()
        self.ns.wait_for_http(self.host, self.port, "/-/ready", timeout_s=timeout_s, proc=self.proc)
        return self

    def stop(self) -> None:
        self.proc.stop(timeout_s=10.0)

    # -- API --

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """GET an API path; the decoded ``data`` of a success, PrometheusError otherwise."""
        target = path + ("?" + urllib.parse.urlencode(params) if params else "")
        result = self.ns.http(self.host, self.port, target, timeout_s=10.0)
        return api_data(target, result.status, result.body)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query: a list of ``{"metric": {...}, "value": [ts, "v"]}``."""
        return vector(promql, self.get("/api/v1/query", {"query": promql}))

    def query_values(self, promql: str, by: Sequence[str]) -> dict[tuple[str, ...], float]:
        """An instant query as ``{(label values in ``by`` order): value}``."""
        out: dict[tuple[str, ...], float] = {}
        for sample in self.query(promql):
            key = tuple(sample["metric"].get(label, "") for label in by)
            out[key] = float(sample["value"][1])
        return out

    def targets(self, state: str = "active") -> list[dict[str, Any]]:
        data = self.get("/api/v1/targets", {"state": state})
        return list(data.get("activeTargets" if state == "active" else "droppedTargets", []))

    def targets_summary(self) -> str:
        """One line per active target: job, scrape URL, health, last error (for failures)."""
        try:
            targets = self.targets()
        except Exception as exc:
            return f"(cannot read /api/v1/targets: {exc})"
        lines = [
            f"{t['labels'].get('job')} {t.get('scrapeUrl')} {t['labels'].get('instance')} "
            f"health={t.get('health')} error={t.get('lastError')!r}"
            for t in sorted(targets, key=lambda t: (t["labels"].get("job"), t.get("scrapeUrl")))
        ]
        return "\n".join(lines) or "(no active targets)"

    def wait_targets(
        self,
        ok: Callable[[list[dict[str, Any]]], bool],
        what: str,
        timeout_s: float = 60.0,
    ) -> list[dict[str, Any]]:
        """Wait until ``ok(active targets)``; PrometheusError with every target's state if not."""
        latest: list[list[dict[str, Any]]] = [[]]

        def check() -> list[dict[str, Any]] | None:
            latest[0] = self.targets()
            return latest[0] if ok(latest[0]) else None

        try:
            return wait_until(check, timeout_s, what, interval_s=0.5, procs=[self.proc])
        except TimeoutError as exc:
            raise PrometheusError(f"{exc}\nactive targets:\n{self.targets_summary()}") from None

    def wait_all_up(
        self, expected: Mapping[str, int], timeout_s: float = 60.0
    ) -> list[dict[str, Any]]:
        """Wait until every job in ``expected`` has that many active targets, all healthy."""

        def ok(targets: list[dict[str, Any]]) -> bool:
            for job, count in expected.items():
                mine = [t for t in targets if t["labels"].get("job") == job]
                if len(mine) != count or any(t.get("health") != "up" for t in mine):
                    return False
            return True

        return self.wait_targets(ok, f"all targets up {dict(expected)}", timeout_s)

    def wait_query(
        self,
        promql: str,
        ok: Callable[[list[dict[str, Any]]], bool],
        what: str,
        timeout_s: float = 30.0,
    ) -> list[dict[str, Any]]:
        latest: list[list[dict[str, Any]]] = [[]]

        def check() -> list[dict[str, Any]] | None:
            latest[0] = self.query(promql)
            return latest[0] if ok(latest[0]) else None

        try:
            return wait_until(check, timeout_s, what, interval_s=0.5, procs=[self.proc])
        except TimeoutError as exc:
            raise PrometheusError(
                f"{exc}\nlast result of {promql}: {latest[0]}\n"
                f"active targets:\n{self.targets_summary()}"
            ) from None

    def reload(self) -> None:
        result = self.ns.http(self.host, self.port, "/-/reload", method="POST")
        if result.status != 200:
            raise PrometheusError(f"reload: HTTP {result.status}: {result.text[:300]}")


def write_textfile(directory: Path, name: str, text: str) -> Path:
    """Write a node_exporter textfile-collector file atomically (``<name>.prom``)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.prom.tmp"
    tmp.write_text(text)
    final = directory / f"{name}.prom"
    tmp.replace(final)
    return final


def parse_exposition(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text format -> ``{(sample name, labels): value}`` (prometheus_client's parser)."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = float(sample.value)
    return out
