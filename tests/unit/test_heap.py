"""raven.runtime.heap: malloc_trim where glibc has it (Debian, the images we ship)."""

from __future__ import annotations

import asyncio
import platform
import sys

import pytest

from raven.runtime import heap


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])


def test_trim_heap_returns_freed_pages_on_glibc() -> None:
    if platform.libc_ver()[0] != "glibc":
        assert heap.trim_heap() is False
        return
    # 125 MiB in blocks below glibc's mmap threshold, so they live in the heap; keeping
    # every 50th leaves the freed ones as holes that free() alone does not give back
    blocks = [bytearray(64 * 1024 - 64) for _ in range(2000)]
    keep = blocks[::50]
    del blocks
    before = _rss_kib()
    assert heap.trim_heap() is True
    assert before - _rss_kib() > 60 * 1024, "malloc_trim returned less than half the holes"
    assert len(keep) == 40


async def test_the_trimmer_runs_until_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    if heap._MALLOC_TRIM is None:
        pytest.fail("the test machines run glibc: malloc_trim must be found")
    monkeypatch.setattr(heap, "_MALLOC_TRIM", lambda pad: calls.append(pad) or 1)
    task = asyncio.create_task(heap.trim_heap_every(0.01))
    while len(calls) < 3:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls[:3] == [0, 0, 0]


def test_both_ways_to_malloc_trim_find_it_on_glibc() -> None:
    """cffi's backend (loaded by cryptography) first, ctypes where it is missing."""
    via_cffi, via_ctypes = heap._from_cffi_backend(), heap._from_ctypes()
    if platform.libc_ver()[0] != "glibc":  # musl, macOS: neither has it
        assert via_cffi is None and via_ctypes is None
        return
    assert via_cffi is not None and via_ctypes is not None
    assert via_cffi(0) in (0, 1) and via_ctypes(0) in (0, 1)
    assert heap._MALLOC_TRIM is not None


def test_without_cffi_the_trim_comes_from_ctypes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "_cffi_backend", None)  # import fails: ImportError
    assert heap._from_cffi_backend() is None
    fn = heap._load_malloc_trim()
    if platform.libc_ver()[0] == "glibc":
        assert fn is not None and type(fn).__module__ == "ctypes"
