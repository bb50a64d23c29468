"""Backfilled scrapes -> the series Prometheus's own scrape would have stored (pure).

Labels: the page's labels unchanged, ``__name__``, then the target labels as the job sets
them: ``job``, ``instance`` (``node:port`` unless configured), the job's extra labels, and for
http_sd jobs the discovery labels the gateway publishes (``node``, ``agent``). With
``honor_labels: false`` (Prometheus's default) a page label that clashes with a target label
is kept as ``exported_<name>``; with ``true`` the page's value wins. Empty values are dropped,
as Prometheus does.

Timestamps: the page's own when it gave one, else the scrape's. Samples older than the
out-of-order window (less a margin) are dropped before sending (one such sample would fail
the whole request and be retried forever); samples ahead of the gateway's clock by more than
the allowed skew are refused (they would block the series' scrapes).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cloud_gateway.backfill.remote_write import Labels, Series
from raven.backfill.wire import Scrape, scraper_mode
from raven.config.backfill import BackfillJob, job_for


def target_labels(
    job: BackfillJob, node: str, port: int, discovery: Mapping[str, str]
) -> dict[str, str]:
    labels = {"job": job.job, "instance": job.instance.format(node=node, port=port)}
    labels.update(job.labels)
    if job.discovery_labels:
        labels.update(discovery)
    return labels


def series_labels(name: str, page: Labels, target: Mapping[str, str], honor_labels: bool) -> Labels:
    """As Prometheus's mutateSampleLabels (scrape/scrape.go, 2.42)."""
    exposed = dict(page)
    labels = dict(exposed)
    if honor_labels:
        for key, value in target.items():
            if key not in exposed:
                labels[key] = value
    else:
        conflicts = [(k, exposed[k]) for k in target if exposed.get(k, "") != ""]
        labels.update(target)
        conflicts.sort(key=lambda kv: len(kv[0]))
        taken: set[str] = set()
        for key, value in conflicts:
            new = key
            while True:
                new = "exported_" + new
                if new not in exposed and new not in target and new not in taken:
                    break
            taken.add(new)
            labels[new] = value
    labels["__name__"] = name
    return tuple(sorted((k, v) for k, v in labels.items() if v != ""))


@functools.lru_cache(maxsize=131072)
def _cached_labels(
    name: str, page: Labels, target: tuple[tuple[str, str], ...], honor_labels: bool
) -> Labels:
    """series_labels for a recurring (series, target): the same series come in every scrape."""
    return series_labels(name, page, dict(target), honor_labels)


@dataclass
class Converted:
    series: list[Series] = field(default_factory=list)
    samples: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str, n: int) -> None:
        if n:
            self.dropped[reason] = self.dropped.get(reason, 0) + n


def convert(
    scrapes: tuple[Scrape, ...],
    *,
    jobs: list[BackfillJob],
    may_serve: Callable[[str], bool],
    discovery: Callable[[str, int], Mapping[str, str]],
    now_ms: int,
    window_ms: int,
    max_skew_ms: int,
) -> Converted:
    out = Converted()
    margin_ms = min(60_000, window_ms // 10)
    oldest_ok = now_ms - window_ms + margin_ms
    newest_ok = now_ms + max_skew_ms
    by_series: dict[Labels, dict[int, float]] = defaultdict(dict)
    for s in scrapes:
        if not may_serve(s.node):
            out.drop("unauthorised", len(s.samples))
            continue
        job = job_for(jobs, s.port, scraper_mode(s.scraper), s.path)
        if job is None:
            out.drop("no_job", len(s.samples))
            continue
        target = tuple(target_labels(job, s.node, s.port, discovery(s.node, s.port)).items())
        for name, page, value, ts in s.samples:
            t_ms = s.ts_ms if ts is None else ts
            if t_ms < oldest_ok:
                out.drop("too_old", 1)
            elif t_ms > newest_ok:
                out.drop("future", 1)
            else:
                by_series[_cached_labels(name, page, target, job.honor_labels)][t_ms] = value
    for labels, points in by_series.items():
        out.series.append((labels, sorted(points.items())))
        out.samples += len(points)
    return out
