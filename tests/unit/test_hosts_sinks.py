"""File sink (atomic, unchanged, unwritable) and the generator loop (debounce, retry, metrics)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import stat
from pathlib import Path

import pytest
from coredns_hosts.metrics import HostsMetrics
from coredns_hosts.model import SinkError, Snapshot, SourceNotReady
from coredns_hosts.runner import HostsGenerator
from coredns_hosts.sinks.file import FileSink
from coredns_hosts.sources import OnChange
from prometheus_client import CollectorRegistry

from tests.helpers import wait_for
from tests.helpers.threads import call_with_file_permissions

V4 = ipaddress.ip_address("10.96.0.50")


def put(sink: FileSink, text: str) -> bool:
    """The sink's write, awaited on a loop of its own (its file work runs in a worker thread
    started from the calling thread, with that thread's capabilities)."""
    return asyncio.run(sink.write(text))


def test_file_sink_atomic_replace_and_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "tunnel-nodes"
    sink = FileSink(path)
    assert put(sink, "10.0.0.1 a\n") is True
    inode = path.stat().st_ino
    assert put(sink, "10.0.0.1 a\n") is False
    assert path.stat().st_ino == inode  # not rewritten
    assert put(sink, "10.0.0.1 b\n") is True
    assert path.read_text() == "10.0.0.1 b\n"
    assert path.stat().st_ino != inode  # replaced by rename, never rewritten in place
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(os.listdir(tmp_path)) == ["tunnel-nodes"]  # no temp file left behind
    assert sink.tmp_path.name == ".tunnel-nodes.tmp"  # dot file: dnsmasq --hostsdir skips it


def test_file_sink_rewrites_after_external_edit(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    sink = FileSink(path)
    put(sink, "x\n")
    path.write_text("edited\n")
    assert put(sink, "x\n") is True and path.read_text() == "x\n"


def test_file_sink_missing_directory_is_clear_error(tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "missing" / "hosts")
    with pytest.raises(SinkError, match=r"cannot write .*missing/hosts: No such file"):
        put(sink, "x\n")


def test_file_sink_failure_keeps_last_good_file(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    sink = FileSink(path)
    put(sink, "good\n")
    sink.tmp_path.mkdir()  # the temp file cannot be created (EISDIR), even as root
    with pytest.raises(SinkError, match="last good file kept"):
        put(sink, "new\n")
    assert path.read_text() == "good\n"


def test_file_sink_read_only_directory(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    put(FileSink(path), "good\n")
    tmp_path.chmod(0o555)
    try:
        # Root (CI) ignores directory permissions: the write runs without that privilege.
        with pytest.raises(SinkError, match=r"cannot write .*hosts: Permission denied"):
            call_with_file_permissions(lambda: put(FileSink(path), "new\n"))
    finally:
        tmp_path.chmod(0o755)
    assert path.read_text() == "good\n"
    assert sorted(os.listdir(tmp_path)) == ["hosts"]


class ListSource:
    """In-memory source: tests change ``names`` and call ``changed()``."""

    origin = "memory"

    def __init__(self) -> None:
        self.names: list[str] = []
        self.ready = True
        self._on_change: OnChange | None = None

    def changed(self) -> None:
        assert self._on_change is not None
        self._on_change()

    def snapshot(self) -> Snapshot:
        if not self.ready:
            raise SourceNotReady("not yet")
        return Snapshot.uniform(self.names, [V4], self.origin)

    async def load(self) -> Snapshot:
        return self.snapshot()

    async def run(self, on_change: OnChange) -> None:
        self._on_change = on_change
        on_change()
        await asyncio.Event().wait()


class MemorySink:
    name = "memory"

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.fail = False

    async def close(self) -> None:
        return None

    async def write(self, text: str) -> bool:
        if self.fail:
            raise SinkError("disk on fire")
        if self.texts and self.texts[-1] == text:
            return False
        self.texts.append(text)
        return True


@contextlib.asynccontextmanager
async def generator_running(**kw: float):  # type: ignore[no-untyped-def]
    source, sink = ListSource(), MemorySink()
    metrics = HostsMetrics(CollectorRegistry())
    gen = HostsGenerator(source, [sink], metrics=metrics, **kw)
    task = asyncio.create_task(gen.run())
    try:
        yield source, sink, gen, metrics.registry
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_burst_of_10k_changes_is_one_write() -> None:
    async with generator_running(debounce_s=0.05, max_delay_s=2.0) as (source, sink, gen, reg):
        await wait_for(lambda: len(sink.texts) == 1)  # the initial (empty) sync
        for i in range(10_000):
            source.names.append(f"edge-{i}")
            source.changed()
        await wait_for(lambda: len(sink.texts) == 2)
        await asyncio.sleep(0.15)  # longer than the quiet time: no further write
        assert len(sink.texts) == 2 and "# names: 10000," in sink.texts[1]
        assert reg.get_sample_value("raven_hosts_writes_total", {"sink": "memory"}) == 2
        assert reg.get_sample_value("raven_hosts_entries") == 10_000
        assert reg.get_sample_value("raven_hosts_last_success_timestamp_seconds") > 0
        assert gen.ready


async def test_invalid_names_are_counted_not_written() -> None:
    async with generator_running(debounce_s=0.01) as (source, sink, gen, reg):
        await wait_for(lambda: gen.ready)
        source.names[:] = ["ok-1", "bad_1", "-bad2"]
        source.changed()
        await wait_for(lambda: reg.get_sample_value("raven_hosts_invalid_names") == 2)
        await wait_for(lambda: "ok-1" in sink.texts[-1])
        assert "bad" not in sink.texts[-1]
        assert reg.get_sample_value("raven_hosts_entries") == 1


async def test_sink_failure_retries_and_recovers() -> None:
    async with generator_running(debounce_s=0.01, retry_s=0.05) as (source, sink, gen, reg):
        await wait_for(lambda: gen.ready)
        sink.fail = True
        source.names[:] = ["edge-1"]
        source.changed()
        await wait_for(
            lambda: (
                (
                    reg.get_sample_value(
                        "raven_hosts_errors_total", {"stage": "sink", "reason": "memory"}
                    )
                    or 0
                )
                >= 2
            )
        )
        assert not gen.ready and "disk on fire" in (gen.last_error or "")
        sink.fail = False  # no new source change needed: the retry timer writes
        await wait_for(lambda: gen.ready and "edge-1" in sink.texts[-1])


async def test_source_not_ready_writes_nothing() -> None:
    async with generator_running(debounce_s=0.01, retry_s=0.05) as (source, sink, gen, _reg):
        await wait_for(lambda: gen.ready)
        source.ready = False
        source.names[:] = ["edge-1"]
        source.changed()
        await wait_for(lambda: not gen.ready)
        assert "source not ready" in (gen.last_error or "") and len(sink.texts) == 1
        source.ready = True
        await wait_for(lambda: gen.ready and len(sink.texts) == 2)


async def test_a_crashing_source_stops_the_generator_with_its_error() -> None:
    class Crashing(ListSource):
        async def run(self, on_change: OnChange) -> None:
            raise RuntimeError("watch thread exploded")

    gen = HostsGenerator(Crashing(), [MemorySink()], metrics=HostsMetrics(CollectorRegistry()))
    with pytest.raises(RuntimeError, match="watch thread exploded"):
        await asyncio.wait_for(gen.run(), 5)
