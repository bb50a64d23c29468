"""A scrape's body -> samples, as Prometheus would ingest them.

Text format 0.0.4 and OpenMetrics (chosen by the response's Content-Type, as Prometheus
does), parsed with prometheus_client's parsers. Every exposed line becomes one sample with
its own name and labels unchanged (histogram buckets, ``_sum``, ``_count``, ``_created``...);
a timestamp on the line is kept (Prometheus honours it by default), otherwise the scrape's
time applies. Nothing is invented: no ``up``, no ``scrape_*`` series.
"""

from __future__ import annotations

import math

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families

from raven.backfill.wire import Sample


class ExpositionError(Exception):
    """The body is not a parsable exposition (one line says why)."""


def _ts_ms(ts: object) -> int | None:
    if ts is None:
        return None
    sec = getattr(ts, "sec", None)
    if sec is not None:  # openmetrics Timestamp(sec, nsec)
        return int(sec) * 1000 + int(getattr(ts, "nsec", 0)) // 1_000_000
    if isinstance(ts, int | float) and math.isfinite(ts):
        return round(float(ts) * 1000)
    return None


def parse_exposition(body: bytes, content_type: str, max_samples: int) -> list[Sample]:
    """Samples of one scrape; ExpositionError for garbage or more than ``max_samples``."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ExpositionError("body is not UTF-8") from None
    openmetrics = content_type.split(";", 1)[0].strip().lower() == "application/openmetrics-text"
    parse = openmetrics_families if openmetrics else text_families
    out: list[Sample] = []
    try:
        for family in parse(text):
            for s in family.samples:
                if len(out) >= max_samples:
                    raise ExpositionError(f"more than {max_samples} samples")
                labels = tuple(sorted((str(k), str(v)) for k, v in s.labels.items()))
                out.append((s.name, labels, float(s.value), _ts_ms(s.timestamp)))
    except ExpositionError:
        raise
    except Exception as exc:  # the parsers raise ValueError, KeyError, IndexError...
        kind = "OpenMetrics" if openmetrics else "text format"
        raise ExpositionError(f"not valid {kind}: {str(exc)[:200]}") from None
    return out
