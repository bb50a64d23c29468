"""A real DNS server reads the generated file: dnsmasq ``--hostsdir`` (inotify reload), dnspython.

dnsmasq reads the same hosts format as CoreDNS's ``hosts`` plugin. It listens on 127.0.0.1 on
a free high port (tests.helpers.dnsmasq). Needs root and dnsmasq; skipped without them, which
fails the run in CI (RAVEN_REQUIRE_E2E=1).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from coredns_hosts.__main__ import main as hosts_main
from coredns_hosts.check import check_names
from coredns_hosts.metrics import HostsMetrics
from coredns_hosts.render import parse_hosts
from coredns_hosts.runner import HostsGenerator
from coredns_hosts.sinks.file import FileSink
from coredns_hosts.sources.static import StaticSource
from prometheus_client import CollectorRegistry

from tests.helpers import wait_for
from tests.helpers.dnsmasq import query, running_dnsmasq

pytestmark = pytest.mark.e2e


@pytest.fixture
def dnsmasq(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    hostsdir = tmp_path / "hostsdir"
    hostsdir.mkdir()
    with running_dnsmasq(hostsdir, tmp_path) as port:
        yield hostsdir, port


async def resolves(name: str, rdtype: str, port: int, want: set[str] | str) -> None:
    deadline = time.monotonic() + 10
    got: set[str] | str = ""
    while time.monotonic() < deadline:
        got = await asyncio.to_thread(query, name, rdtype, port)
        if got == want:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{name} {rdtype}: wanted {want}, dnsmasq answered {got}")


async def cli(argv: list[str]) -> int:
    """The CLI runs its own event loop: run it on a thread."""
    return await asyncio.to_thread(hosts_main, argv)


@contextlib.asynccontextmanager
async def generator(static: Path, out: Path) -> AsyncIterator[HostsGenerator]:
    metrics = HostsMetrics(CollectorRegistry())
    source = StaticSource(static, gateway_addresses=[], metrics=metrics, interval_s=0.05)
    gen = HostsGenerator(source, [FileSink(out)], metrics=metrics, debounce_s=0.02)
    task = asyncio.create_task(gen.run())
    try:
        yield gen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_dnsmasq_answers_follow_the_generated_file(dnsmasq, tmp_path: Path) -> None:
    hostsdir, port = dnsmasq
    static = tmp_path / "nodes.yaml"
    names = [f"edge-gpu-{i}" for i in range(300)]
    static.write_text(
        'gateway_addresses: [10.96.0.50, "fd00::50"]\nnodes:\n'
        + "".join(f"  - {n}\n" for n in names)
        + "  - Bad_Name\n"
    )
    out = hostsdir / "tunnel-nodes"
    async with generator(static, out) as gen:
        await wait_for(lambda: gen.syncs >= 1)
        await resolves("edge-gpu-7", "A", port, {"10.96.0.50"})
        await resolves("edge-gpu-7", "AAAA", port, {"fd00::50"})
        await resolves("bad_name", "A", port, "NXDOMAIN")
        expected = parse_hosts(out.read_text())
        assert len(expected) == 300
        assert await check_names(expected, "127.0.0.1", port) == []

        # change the inputs: one node leaves, one joins, the gateway moves to another IP
        static.write_text(
            "gateway_addresses: [10.96.0.77]\nnodes:\n"
            + "".join(f"  - {n}\n" for n in names[1:])
            + "  - edge-new\n"
        )
        await resolves("edge-new", "A", port, {"10.96.0.77"})
        await resolves("edge-gpu-0", "A", port, "NXDOMAIN")
        await resolves("edge-gpu-7", "A", port, {"10.96.0.77"})  # no stale duplicate
        await resolves("edge-gpu-7", "AAAA", port, set())
        assert [p.name for p in hostsdir.iterdir()] == ["tunnel-nodes"]

    # the CLI check: 0 when every name matches, 1 with a line per mismatch otherwise
    server = f"127.0.0.1:{port}"
    assert await cli(["check", "--server", server, "--hosts-file", str(out)]) == 0
    wrong = tmp_path / "wrong"
    wrong.write_text("10.96.0.77 edge-gpu-5\n10.96.0.1 edge-gpu-6\n10.96.0.77 edge-gone\n")
    assert await cli(["check", "--server", server, "--hosts-file", str(wrong)]) == 1
    mismatches = await check_names(parse_hosts(wrong.read_text()), "127.0.0.1", port)
    assert [(m.name, m.rdtype, m.detail) for m in mismatches] == [
        ("edge-gone", "A", "NXDOMAIN"),
        ("edge-gpu-6", "A", ""),
    ]
    assert mismatches[1].got == {ipaddress.ip_address("10.96.0.77")}


async def test_cli_once_then_check_against_dnsmasq(dnsmasq, tmp_path: Path) -> None:
    hostsdir, port = dnsmasq
    static = tmp_path / "nodes.yaml"
    static.write_text("- edge-a\n- edge-b\n")
    base = ["--source", "static", "--static-file", str(static), "--gateway-address", "10.1.2.3"]
    out = hostsdir / "tunnel-nodes"
    assert await cli(["run", "--once", *base, "--output", str(out)]) == 0
    await resolves("edge-b", "A", port, {"10.1.2.3"})
    assert await cli(["check", "--server", f"127.0.0.1:{port}", *base]) == 0
    static.write_text("- edge-a\n- edge-b\n- edge-c\n")  # not regenerated yet: a mismatch
    assert await cli(["check", "--server", f"127.0.0.1:{port}", *base]) == 1
    assert await cli(["run", "--once", *base, "--output", str(out)]) == 0
    await resolves("edge-c", "A", port, {"10.1.2.3"})
    assert await cli(["check", "--server", f"127.0.0.1:{port}", *base]) == 0
