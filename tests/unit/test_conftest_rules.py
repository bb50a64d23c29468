"""The rules tests/conftest.py puts on every test, checked on a small test file run by pytest."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).parents[1] / "conftest.py"

SAMPLE = """
import asyncio

import pytest


def test_skipped():
    pytest.skip("no such tool here")


async def test_leaves_a_task_running():
    asyncio.get_running_loop().create_task(asyncio.sleep(3600))


async def test_callback_raises():
    asyncio.get_running_loop().call_soon(lambda: 1 / 0)
    await asyncio.sleep(0.01)


async def test_task_exception_never_retrieved():
    async def boom():
        raise ValueError("lost")

    asyncio.get_running_loop().create_task(boom())
    await asyncio.sleep(0.01)


@pytest.fixture
async def background():
    task = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
    yield
    task.cancel()


async def test_a_fixture_that_cleans_up_is_no_leak(background):
    await asyncio.sleep(0)


@pytest.mark.xfail(reason="known", strict=True)
def test_expected_failure():
    raise AssertionError
"""


@pytest.fixture
def inner(pytester: pytest.Pytester) -> Iterator[pytest.Pytester]:
    """A pytest run in this process under tests/conftest.py. Loading that conftest again loads
    a hypothesis profile, so the profile of this run is restored afterwards."""
    profile = settings.get_current_profile_name()
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    try:
        yield pytester
    finally:
        settings.load_profile(profile)


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_sample=SAMPLE)
    return pytester.runpytest("-p", "no:cacheprovider", "-rA", *args)


def test_leaks_and_unhandled_loop_errors_fail_async_tests(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAVEN_REQUIRE_E2E", raising=False)
    result = _run(inner)
    # the three bodies pass; their teardown fails them
    result.assert_outcomes(passed=4, skipped=1, xfailed=1, errors=3)
    result.stdout.fnmatch_lines_random(
        [
            "ERROR test_sample.py::test_leaves_a_task_running - *",
            "ERROR test_sample.py::test_callback_raises - *",
            "ERROR test_sample.py::test_task_exception_never_retrieved - *",
            "E * Failed: test left 1 task(s) running: *sleep*",
            "E * Exception in callback *: ZeroDivisionError('division by zero')",
            "E * Task exception was never retrieved: ValueError('lost')",
        ]
    )


def test_in_ci_every_skip_fails_the_run(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAVEN_REQUIRE_E2E", "1")
    result = _run(inner, "-k", "skipped or expected_failure")
    result.assert_outcomes(failed=1, xfailed=1)
    result.stdout.fnmatch_lines(
        ["*RAVEN_REQUIRE_E2E=1 turns every skip into a failure*no such tool*"]
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_in_ci_a_skipped_module_fails_the_run(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAVEN_REQUIRE_E2E", "1")
    inner.makepyfile(
        test_module_skip='import pytest\npytest.skip("no data", allow_module_level=True)\n'
    )
    result = inner.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*RAVEN_REQUIRE_E2E=1 turns every skip into a failure*no data*"])
    assert result.ret == pytest.ExitCode.INTERRUPTED


def test_no_test_file_sets_its_own_hypothesis_budget() -> None:
    """Budgets come from the profiles in tests/conftest.py (tests/README.md)."""
    offenders = [
        f"{path.relative_to(CONFTEST.parent)}:{number}"
        for path in sorted(CONFTEST.parent.rglob("*.py"))
        if path != CONFTEST and path != Path(__file__)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"@settings\b|\bmax_examples\s*=|\bdeadline=None", line)
    ]
    assert offenders == []
