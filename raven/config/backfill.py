"""Backfill configuration of the agent and the gateway (docs/backfill.md)."""

from __future__ import annotations

from dataclasses import dataclass

from raven.config.loader import doc
from raven.config.remote_write import RemoteWriteConfig
from raven.protocol.names import is_valid_node_name


@dataclass(frozen=True)
class ExplicitTarget:
    """A target the agent scrapes during outages even before (or instead of) learning it."""

    node: str = doc("Node name (one the agent serves).")
    port: int = doc("Port.")
    path: str = doc("Path (with query) as Prometheus requests it.", default="/metrics")
    interval_s: float = doc("Scrape interval, as in Prometheus's scrape config.", default=15.0)
    timeout_s: float = doc("Scrape timeout.", default=10.0)
    accept: str = doc(
        "Accept header sent (Prometheus's own when empty).",
        default="application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
        "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    )

    def __post_init__(self) -> None:
        if not is_valid_node_name(self.node):
            raise ValueError(f"backfill.targets: {self.node!r} is not a valid node name")
        if not 0 < self.port < 65536:
            raise ValueError(f"backfill.targets: {self.port} is not a port")
        if not self.path.startswith("/"):
            raise ValueError("backfill.targets: path must start with /")
        if not 0 < self.timeout_s <= self.interval_s:
            raise ValueError("backfill.targets: need 0 < timeout_s <= interval_s")


@dataclass(frozen=True)
class AgentBackfillConfig:
    """Keep scraping while the tunnel is down and backfill Prometheus after reconnect."""

    enabled: bool = doc("Learn scrapes, scrape locally during outages, backfill.", default=False)
    dir: str = doc(
        "Directory of the on-disk buffer (buffer.sqlite3 in it).", default="/var/lib/raven"
    )
    max_bytes: int = doc(
        "Size cap of the buffered scrapes; the oldest go first (counted).",
        default=1024 * 1024 * 1024,
    )
    max_age_s: float = doc(
        "Buffered samples older than this are dropped (counted).", default=86400.0
    )
    synchronous: str = doc(
        "SQLite synchronous mode: 'normal' (survives kill -9) or 'full' (also power loss).",
        default="normal",
    )
    learn: bool = doc("Learn targets from the scrapes the relay serves.", default=True)
    targets: list[ExplicitTarget] = doc(
        "Explicit targets: override what was learned for the same node/port/path, or add.",
        default_factory=list,
    )
    max_targets: int = doc("Targets remembered at most (learned and explicit).", default=10000)
    forget_after_s: float = doc(
        "A learned target Prometheus stopped scraping while a tunnel was up is forgotten after"
        " this long.",
        default=3600.0,
    )
    max_scrape_bytes: int = doc("Largest local scrape body (after gzip).", default=16 * 1024 * 1024)
    max_samples_per_scrape: int = doc("Samples kept from one local scrape.", default=200000)
    max_concurrent_scrapes: int = doc("Local scrapes at once.", default=32)
    send_bytes_per_s: int = doc(
        "Backfill budget on the tunnel (compressed bytes/s); live scrapes are never queued"
        " behind more than one batch.",
        default=2 * 1024 * 1024,
    )
    batch_bytes: int = doc(
        "Stored bytes per backfill batch (smaller: shorter bursts of work beside live scrapes).",
        default=64 * 1024,
    )
    send_duty_cycle: float = doc(
        "Share of the time backfill may be busy: after a batch that took t seconds to be"
        " acknowledged, the next waits t * (1 - d) / d (0.5: as long again).",
        default=0.5,
    )

    def __post_init__(self) -> None:
        if self.synchronous not in ("normal", "full"):
            raise ValueError("backfill.synchronous must be 'normal' or 'full'")
        if not 0 < self.send_duty_cycle <= 1:
            raise ValueError("backfill.send_duty_cycle must be in (0, 1]")
        if self.max_bytes < 1024 * 1024:
            raise ValueError("backfill.max_bytes must be at least 1 MiB")
        for name in ("max_age_s", "forget_after_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"backfill.{name} must be positive")
        for name in (
            "max_targets",
            "max_scrape_bytes",
            "max_samples_per_scrape",
            "max_concurrent_scrapes",
            "send_bytes_per_s",
            "batch_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"backfill.{name} must be positive")


@dataclass(frozen=True)
class BackfillJob:
    """How Prometheus labels the scrapes of one edge port (its scrape config's job)."""

    port: int = doc("Edge port (e.g. 9400).")
    job: str = doc("The `job` label of the Prometheus job scraping that port.")
    instance: str = doc(
        "The `instance` label; {node} and {port} are replaced.", default="{node}:{port}"
    )
    honor_labels: bool = doc(
        "As the job's honor_labels: false renames a page's own job/instance to"
        " exported_job/exported_instance; true keeps the page's.",
        default=False,
    )
    discovery_labels: bool = doc(
        "The job uses the gateway's http_sd: add its target labels (node, agent).",
        default=False,
    )
    labels: dict[str, str] = doc(
        "Further target labels the job adds (static_configs labels, relabelling results).",
        default_factory=dict,
    )
    mode: str | None = doc(
        "Only the scrapes this job makes in this addressing mode: `dns` (the node's name"
        " resolves to the gateway), `forward` (`proxy_url`), `path` (`/proxy/<node>:<port>/...`);"
        " unset: any. Two jobs on one port are told apart by mode or path.",
        default=None,
    )
    path: str | None = doc(
        "Only the scrapes of this path (with its query, e.g. `/metrics?collect[]=gpu`);"
        " unset: any.",
        default=None,
    )

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"backfill.jobs: {self.port} is not a port")
        if not self.job:
            raise ValueError("backfill.jobs: job must not be empty")
        if self.mode is not None and self.mode not in JOB_MODES:
            raise ValueError(
                f"backfill.jobs: mode {self.mode!r} is not one of {', '.join(JOB_MODES)}"
            )
        if self.path is not None and not self.path.startswith("/"):
            raise ValueError(f"backfill.jobs: path {self.path!r} must start with /")

    @property
    def scope(self) -> tuple[int, str | None, str | None]:
        return (self.port, self.mode, self.path)

    def matches(self, port: int, mode: str, path: str) -> bool:
        """Whether this job made a scrape of ``port``/``path`` in ``mode`` ("": not known)."""
        return (
            self.port == port
            and (self.mode is None or not mode or self.mode == mode)
            and (self.path is None or self.path == path)
        )


#: The addressing modes a job can scrape the gateway in (cloud_gateway/proxy/target.py's Mode).
JOB_MODES = ("dns", "forward", "path")


def job_for(jobs: list[BackfillJob], port: int, mode: str, path: str) -> BackfillJob | None:
    """The job that made a scrape: of those matching, the one with the most settings."""
    found = [j for j in jobs if j.matches(port, mode, path)]
    return max(found, key=lambda j: (j.path is not None, j.mode is not None), default=None)


@dataclass(frozen=True)
class GatewayBackfillConfig:
    """Write agents' backfilled samples to Prometheus (remote write 1.0)."""

    enabled: bool = doc("Accept backfill from agents.", default=False)
    remote_write_url: str = doc(
        "The remote-write receiver: Prometheus (needs --web.enable-remote-write-receiver),"
        " VictoriaMetrics, Thanos Receive, Mimir, a managed service (docs/backfill.md). With"
        " `receivers: per_scraper` a template: `{scraper}` is the address of the Prometheus"
        " replica that scraped (`http://{scraper}:9090/api/v1/write`).",
        default="http://127.0.0.1:9090/api/v1/write",
    )
    receivers: str = doc(
        "`shared`: one receiver for every scraper (of an HA pair's two copies of a target one"
        " is written); `per_scraper`: each Prometheus replica gets its own scrapes, at the"
        ' `remote_write_url` template (docs/backfill.md, "HA pairs and several scrapers").',
        default="shared",
    )
    remote_write: RemoteWriteConfig = doc(
        "Authentication, TLS and headers for the receiver (Prometheus's `remote_write` names).",
        default_factory=RemoteWriteConfig,
    )
    out_of_order_window_s: float = doc(
        "Prometheus's storage.tsdb.out_of_order_time_window; older samples are dropped"
        " (counted) before sending, with a safety margin of a tenth (at most 60 s).",
        default=3600.0,
    )
    max_clock_skew_s: float = doc(
        "Samples more than this ahead of the gateway's clock are refused (counted).",
        default=10.0,
    )
    timeout_s: float = doc("Timeout of one remote-write request.", default=30.0)
    max_retry_after_s: float = doc(
        "The longest wait a receiver's `Retry-After` (429, 503) is honoured for; meanwhile"
        " batches are kept by the agents, not sent.",
        default=300.0,
    )
    jobs: list[BackfillJob] = doc(
        "Job per edge port; ports not listed are not backfilled.", default_factory=list
    )

    def __post_init__(self) -> None:
        if not self.remote_write_url.startswith(("http://", "https://")):
            raise ValueError("backfill.remote_write_url must be an http(s) URL")
        if self.receivers not in ("shared", "per_scraper"):
            raise ValueError("backfill.receivers must be shared or per_scraper")
        if (self.receivers == "per_scraper") != ("{scraper}" in self.remote_write_url):
            raise ValueError(
                "backfill.remote_write_url holds {scraper} exactly when receivers is"
                " per_scraper (e.g. http://{scraper}:9090/api/v1/write)"
            )
        if (
            self.out_of_order_window_s <= 0
            or self.timeout_s <= 0
            or self.max_clock_skew_s < 0
            or self.max_retry_after_s < 0
        ):
            raise ValueError("backfill: windows and timeouts must be positive")
        scopes = [j.scope for j in self.jobs]
        if len(set(scopes)) != len(scopes):
            raise ValueError(
                "backfill.jobs: two jobs with the same port, mode and path (tell them apart"
                " by mode or path)"
            )
