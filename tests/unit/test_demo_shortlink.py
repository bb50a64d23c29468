"""The demo's Prometheus link: the graph's range fits the demo's age."""

from __future__ import annotations

import pytest

from raven_cli.demo.shortlink import RANGES, ShortLink, range_for


@pytest.mark.parametrize(
    ("age_s", "expected"),
    [(0, "1m"), (59, "1m"), (60, "1m"), (61, "5m"), (900, "15m"), (901, "1h"),
     (5 * 3600, "12h"), (30 * 86400, "1w")],
)  # fmt: skip
def test_range_fits_age(age_s: float, expected: str) -> None:
    assert range_for(age_s) == expected


def test_ranges_grow() -> None:
    limits = [limit for limit, _ in RANGES]
    assert limits == sorted(limits)


def test_location_uses_the_age_when_opened() -> None:
    now = [100.0]
    link = ShortLink(lambda r: f"http://prom/graph?g0.range_input={r}", clock=lambda: now[0])
    assert link.location().endswith("=1m")
    now[0] += 600  # ten minutes later the same link opens a wider range
    assert link.location().endswith("=15m")
