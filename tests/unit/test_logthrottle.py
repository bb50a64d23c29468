import logging

from raven.telemetry.logthrottle import LogThrottle


def test_burst_then_one_summary_per_interval(caplog) -> None:
    now = [0.0]
    throttle = LogThrottle(burst=3, interval_s=10.0, clock=lambda: now[0])
    log = logging.getLogger("t")
    with caplog.at_level(logging.WARNING, logger="t"):
        for i in range(100):
            throttle.log(log, logging.WARNING, "k", "event %d", i)
        assert [r.getMessage() for r in caplog.records] == ["event 0", "event 1", "event 2"]
        now[0] = 11.0
        throttle.log(log, logging.WARNING, "k", "event %d", 100)
    assert [r.getMessage() for r in caplog.records][3:] == [
        "k: 97 similar lines suppressed",
        "event 100",
    ]
