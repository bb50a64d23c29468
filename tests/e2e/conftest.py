"""Fixtures of the end-to-end tests: prerequisites, a Lab that is always cleaned up, and the
last lines of every process log printed when a test fails."""

from __future__ import annotations

import faulthandler
import signal
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.helpers.e2e.netns import Lab, cleanup_stale, require_e2e

#: After this long a test's threads' stacks are dumped to stderr (the test goes on).
HANG_DUMP_S = 240.0


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture
def lab(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Lab]:
    """A Lab in ``tmp_path``: namespaces and processes, all removed after the test. When the
    test fails, the last lines of every process log are printed (pytest shows them)."""
    require_e2e()
    cleanup_stale()
    the_lab = Lab(tmp_path)
    # A hang must not be silent: dump every thread's stack if the test runs far too long.
    faulthandler.dump_traceback_later(HANG_DUMP_S, exit=False)
    # A CI timeout sends SIGTERM: turn it into an exception so the cleanup below still runs.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield the_lab
    finally:
        signal.signal(signal.SIGTERM, previous)
        faulthandler.cancel_dump_traceback_later()
        rep = getattr(request.node, "rep_call", None)
        if rep is None or rep.failed:  # failed, or never finished (interrupted)
            print("\n===== e2e diagnostics =====")
            print(the_lab.diagnostics())
        the_lab.close()
