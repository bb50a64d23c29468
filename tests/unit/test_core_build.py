"""Which build of the sans-IO core the tests run: pure Python unless RAVEN_EXPECT_COMPILED=1.

scripts/test runs the pure-Python core (a compiled build left in place fails here, so the
test command never tests the compiled core by accident); scripts/test-compiled builds it with
mypyc (scripts/build-compiled), sets RAVEN_EXPECT_COMPILED=1 and runs the same tests on it.
"""

from __future__ import annotations

import importlib
import os

import pytest

#: Modules scripts/build-compiled compiles (the rest of raven/protocol stays pure).
COMPILED = ("codes", "connection", "mux", "noise", "records", "scheduler", "secure_channel",
            "streams", "frame_fields", "handshake", "lifecycle", "names")  # fmt: skip
PURE = ("frames", "events", "limits")


def _is_extension(name: str) -> bool:
    module = importlib.import_module(f"raven.protocol.{name}")
    return str(module.__file__).endswith(".so")


@pytest.mark.parametrize("name", COMPILED)
def test_core_module_build_is_the_expected_one(name: str) -> None:
    expected = os.environ.get("RAVEN_EXPECT_COMPILED") == "1"
    assert _is_extension(name) == expected, (
        "a mypyc build of raven/protocol is in place: scripts/build-compiled --clean"
        if not expected
        else "RAVEN_EXPECT_COMPILED=1 but the core is pure: run scripts/build-compiled"
    )


@pytest.mark.parametrize("name", PURE)
def test_dataclass_modules_stay_pure(name: str) -> None:
    assert not _is_extension(name)
