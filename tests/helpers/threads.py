"""Calls in a fresh thread set up with state Linux keeps per thread: capabilities, the network
namespace. The rest of the test process keeps its own."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")
_CAP_VERSION_3 = 0x20080522
#: The capabilities that let root ignore file and directory permissions.
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _drop_dac_override() -> None:
    """Clear the DAC capabilities from the calling thread's effective set (Linux keeps
    capabilities per thread; the rest of the process keeps its own)."""
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = _CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        data[cap // 32].effective &= ~(1 << (cap % 32))
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


class ThreadDidNotReturn(Exception):
    """``call_in_thread``'s thread is still running after its timeout."""


def call_in_thread(
    fn: Callable[[], _T],
    *,
    prepare: Callable[[], None] | None = None,
    name: str = "test-helper",
    timeout_s: float = 10.0,
) -> _T:
    """Call ``fn`` in a fresh thread, after ``prepare()`` has set that thread up (state Linux
    keeps per thread: capabilities, network namespace); return what ``fn`` returns, raise what
    ``prepare`` or ``fn`` raises, ThreadDidNotReturn after ``timeout_s``."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            if prepare is not None:
                prepare()
            outcome["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise ThreadDidNotReturn(f"{fn!r} did not return within {timeout_s}s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


def call_with_file_permissions(fn: Callable[[], _T]) -> _T:
    """Call ``fn`` in a thread that file permissions apply to, even when the tests run as root
    (CI): the thread drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH first."""
    return call_in_thread(fn, prepare=_drop_dac_override, name="file-permissions")
