"""The agent's recovery probing after a lost tunnel: jitter and failure classification."""

from __future__ import annotations

import errno
import random

from edge_agent.gateway_link import path_broken, probe_delay


def test_recovery_probes_are_jittered_over_the_window() -> None:
    """Thousands of agents whose path returns at once spread their next attempt evenly over
    the probe window (no thundering herd at one instant)."""
    rng = random.Random(17)
    delays = [probe_delay(1.0, rng) for _ in range(5000)]
    assert min(delays) >= 0.05 and max(delays) <= 1.0
    buckets = [0] * 10
    for d in delays:
        buckets[min(9, int(d * 10))] += 1
    # uniform: each 100 ms holds about 1/10 (first bucket a bit less); none gets a spike
    assert max(buckets) < 5000 / 10 * 1.2


def test_path_broken_classification() -> None:
    assert path_broken(TimeoutError())
    assert path_broken(OSError(errno.EHOSTUNREACH, "no route"))
    assert not path_broken(ConnectionRefusedError(errno.ECONNREFUSED, "refused"))
    assert not path_broken(ConnectionError("handshake got no answer"))
