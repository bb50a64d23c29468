"""The one retry-delay formula: exponential backoff with full jitter.

Used by the agent's reconnects, the Kubernetes reflector, the hosts generator's retries and
its ConfigMap writer. Pure: the caller sleeps; randomness comes from an injectable ``rng``.
"""

from __future__ import annotations

import random

#: Attempts beyond this do not grow the bound further (2**30 times the minimum is plenty).
_MAX_DOUBLINGS = 30


def backoff_delay(attempt: int, min_s: float, max_s: float, rng: random.Random) -> float:
    """Delay before retry ``attempt`` (0-based): uniform in [0, min(max_s, min_s * 2**attempt)]
    ("full jitter", so many clients failing together spread out), at least ``min_s / 2``."""
    bound = min(max_s, min_s * (2 ** min(max(attempt, 0), _MAX_DOUBLINGS)))
    return max(min_s / 2, rng.uniform(0, bound))


class Backoff:
    """Failures in a row and the delay before the next try."""

    def __init__(self, min_s: float, max_s: float, *, rng: random.Random | None = None) -> None:
        if not 0 < min_s <= max_s:
            raise ValueError(f"need 0 < min_s <= max_s, got {min_s} and {max_s}")
        self.min_s = min_s
        self.max_s = max_s
        self.rng = rng or random.Random()
        self.attempt = 0

    def next_delay(self) -> float:
        """The delay before the next try; counts one more failure."""
        delay = backoff_delay(self.attempt, self.min_s, self.max_s, self.rng)
        self.attempt += 1
        return delay

    def reset(self) -> None:
        """A success: the next failure starts from the minimum again."""
        self.attempt = 0
