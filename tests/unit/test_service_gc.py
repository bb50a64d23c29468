"""freeze_startup_objects: start-up objects leave the collector's scans, and the young
generation is collected less often (raven.runtime.service)."""

from __future__ import annotations

import gc

from raven.runtime.service import GC_YOUNG_THRESHOLD, freeze_startup_objects


def test_startup_objects_are_frozen_and_the_young_threshold_raised() -> None:
    before = gc.get_threshold()
    try:
        freeze_startup_objects()
        assert gc.get_freeze_count() > 10_000  # modules, classes, functions of the process
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *before[1:])
        cycle: list[object] = []
        cycle.append(cycle)  # garbage made after the freeze is still collected
        del cycle
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
