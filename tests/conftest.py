"""Rules for every test.

- Every async test is checked for leaked tasks (after wireguard-go's goroutine leak check):
  a task the test (or its fixtures) started and did not finish by the end of teardown fails it.
  So does an error the event loop reported because nobody handled it (an exception in a
  callback, a task's exception never retrieved): the default handler would only log it.
- In CI (``RAVEN_REQUIRE_E2E=1``) a skipped test fails the run, whatever skipped it: a missing
  tool, a missing privilege or a missing file must never turn into a silent pass.
- Property and fuzz tests (hypothesis) take their budget from a settings profile, never from
  the test: ``ci`` (the default, bounded) or ``fuzz`` (long runs: ``HYPOTHESIS_PROFILE=fuzz`` or
  ``pytest --hypothesis-profile=fuzz``). See tests/README.md.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Generator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from pytest_asyncio import is_async_test

REQUIRE_ENV = "RAVEN_REQUIRE_E2E"

# No deadline: a loaded CI machine must not turn a slow example into a failure (timings are not
# asserted anywhere). Failures print the blob that replays them (@reproduce_failure).
settings.register_profile(
    "ci",
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("fuzz", parent=settings.get_profile("ci"), max_examples=20_000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
#: Turns of the loop a closing transport or a cancelled task gets before it counts as leaked.
LEAK_GRACE_TURNS = 50
LEAK_GRACE_STEP_S = 0.01


def skips_fail() -> bool:
    """True in CI: every skip is turned into a failure."""
    return os.environ.get(REQUIRE_ENV) == "1"


async def _leaked_since(before: set[asyncio.Task[object]]) -> set[asyncio.Task[object]]:
    current = asyncio.current_task()
    leaked: set[asyncio.Task[object]] = set()
    for _ in range(LEAK_GRACE_TURNS):
        leaked = {t for t in asyncio.all_tasks() - before if t is not current and not t.done()}
        if not leaked:
            break
        await asyncio.sleep(LEAK_GRACE_STEP_S)
    return leaked


@pytest.fixture
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fails the test when tasks started after its set-up are still running after teardown."""
    before = set(asyncio.all_tasks())
    yield
    leaked = await _leaked_since(before)
    if not leaked:
        return
    for task in leaked:
        task.cancel()
    await asyncio.gather(*leaked, return_exceptions=True)
    names = ", ".join(sorted(t.get_name() + ":" + repr(t.get_coro()) for t in leaked))
    pytest.fail(f"test left {len(leaked)} task(s) running: {names}")


@pytest.fixture
async def no_unhandled_loop_errors() -> AsyncIterator[None]:
    """Fails the test when the event loop reported an error that nobody handled."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        yield
    finally:
        loop.set_exception_handler(None)
    if reported:
        lines = [f"{c.get('message')}: {c.get('exception')!r}" for c in reported]
        pytest.fail("the event loop reported unhandled errors:\n" + "\n".join(lines))


@pytest.fixture(autouse=True)
def _check_async_tests(request: pytest.FixtureRequest) -> None:
    """Applies ``no_unhandled_loop_errors`` and ``no_leaked_tasks`` to every async test. An
    autouse fixture is set up before the test's own fixtures, so the checks are torn down last,
    after every fixture has cleaned up."""
    if isinstance(request.node, pytest.Function) and is_async_test(request.node):
        request.getfixturevalue("no_unhandled_loop_errors")
        request.getfixturevalue("no_leaked_tasks")


def _fail_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    report.outcome = "failed"
    report.longrepr = f"{REQUIRE_ENV}=1 turns every skip into a failure; {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if skips_fail():
        _fail_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    if skips_fail():
        _fail_skip(report)
    return report
