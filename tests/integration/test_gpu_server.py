"""The exporter over loopback HTTP: routes, gzip, failure isolation, CLI, pod-resources gRPC."""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter import cli
from gpu_exporter.backend import Snapshot
from gpu_exporter.counters import default_counters
from gpu_exporter.exposition import ExpositionOptions
from gpu_exporter.podresources import (
    LIST_METHOD,
    ContainerDevices,
    PodResources,
    PodResourcesClient,
    PodResourcesError,
    encode_list_response,
)
from gpu_exporter.server import GpuExporter
from gpu_exporter.simulated import SimulatedBackend
from tests.helpers import free_port, wait_for

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def make_exporter(backend: object, interval_s: float = 30.0, **kw: object) -> GpuExporter:
    return GpuExporter(
        backend,  # type: ignore[arg-type]
        counters=default_counters(),
        options=ExpositionOptions(hostname="edge-gpu-1", kubernetes=True),
        interval_s=interval_s,
        host="127.0.0.1",
        port=0,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        yield s


async def get(
    http: aiohttp.ClientSession, ex: GpuExporter, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    headers = headers or {"Accept-Encoding": "identity"}
    async with http.get(f"http://127.0.0.1:{ex.port}{path}", headers=headers) as r:
        return r.status, dict(r.headers), await r.read()


async def test_metrics_health_index(http: aiohttp.ClientSession) -> None:
    t = 1_763_780_000.0
    backend = SimulatedBackend(2, seed=1, load_profile="training")
    async with make_exporter(backend, clock=lambda: t) as ex:
        status, headers, body = await get(http, ex, "/metrics")
        assert status == 200
        assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
        fam = families(body.decode())
        expected = backend.collect(frozenset({"DCGM_FI_DEV_GPU_TEMP"}), t)
        got = {lbl["gpu"]: v for lbl, v in fam["DCGM_FI_DEV_GPU_TEMP"]}
        assert got == {str(g.info.index): g.values["DCGM_FI_DEV_GPU_TEMP"] for g in expected.gpus}
        assert fam["raven_gpu_exporter_gpu_up"] and all(
            v == 1 for _, v in fam["raven_gpu_exporter_gpu_up"]
        )
        assert fam["raven_gpu_exporter_collections_total"][0][1] >= 1
        status, _, body = await get(http, ex, "/health")
        assert (status, body) == (200, b"OK\n")
        status, headers, body = await get(http, ex, "/")
        assert status == 200 and b'href="./metrics"' in body


async def test_gzip_when_asked(http: aiohttp.ClientSession) -> None:
    async with make_exporter(SimulatedBackend(2)) as ex:
        status, headers, body = await get(http, ex, "/metrics", headers={"Accept-Encoding": "gzip"})
        assert status == 200 and headers.get("Content-Encoding") == "gzip"
        assert b"DCGM_FI_DEV_GPU_TEMP" in gzip.decompress(body)


async def test_failed_gpu_drops_series_scrape_stays_200(http: aiohttp.ClientSession) -> None:
    async with make_exporter(SimulatedBackend(3, failing=[1])) as ex:
        status, _, body = await get(http, ex, "/metrics")
        assert status == 200
        fam = families(body.decode())
        assert {lbl["gpu"] for lbl, _ in fam["DCGM_FI_DEV_GPU_TEMP"]} == {"0", "2"}
        up = {lbl["gpu"]: v for lbl, v in fam["raven_gpu_exporter_gpu_up"]}
        assert up == {"0": 1.0, "1": 0.0, "2": 1.0}


class FlakyBackend:
    """Works, then raises on every collection."""

    name = "flaky"

    def __init__(self) -> None:
        self.inner = SimulatedBackend(1)
        self.fail = False

    def collect(self, fields: frozenset[str], now: float) -> Snapshot:
        if self.fail:
            raise RuntimeError("driver wedged")
        return self.inner.collect(fields, now)

    def close(self) -> None:
        pass


async def test_failed_collections_withdraw_series_then_healthz_fails(
    http: aiohttp.ClientSession,
) -> None:
    backend = FlakyBackend()
    async with make_exporter(backend, interval_s=0.05, unhealthy_after=3) as ex:
        status, _, _ = await get(http, ex, "/metrics")
        assert status == 200
        backend.fail = True
        await wait_for(lambda: ex.health()[0] is False, "three failed collections", timeout_s=20)
        status, _, body = await get(http, ex, "/metrics")
        assert status == 200
        fam = families(body.decode())
        assert "DCGM_FI_DEV_GPU_TEMP" not in fam  # stale values withdrawn, not served as live
        assert {v for _, v in fam["raven_gpu_exporter_gpu_up"]} == {0.0}
        assert fam["raven_gpu_exporter_consecutive_failed_collections"][0][1] >= 3
        errors = [
            v for lbl, v in fam["raven_gpu_exporter_collections_total"] if lbl["result"] == "error"
        ]
        assert errors and errors[0] >= 3
        for path in ("/health", "/healthz"):
            status, _, text = await get(http, ex, path)
            assert status == 503 and b"driver wedged" in text, path
        assert (await get(http, ex, "/readyz"))[0] == 503
        backend.fail = False
        await wait_for(lambda: ex.health()[0] and ex.ready()[0], "recovery", timeout_s=20)
        assert (await get(http, ex, "/healthz"))[0] == 200
        fam = families((await get(http, ex, "/metrics"))[2].decode())
        assert fam["DCGM_FI_DEV_GPU_TEMP"]


class HangingBackend:
    """Blocks inside collect (a hung NVML call) until released."""

    name = "hanging"

    def __init__(self) -> None:
        self.inner = SimulatedBackend(1)
        self.hang = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def collect(self, fields: frozenset[str], now: float) -> Snapshot:
        self.calls += 1
        if self.hang.is_set():
            self.release.wait(30)
        return self.inner.collect(fields, now)

    def close(self) -> None:
        pass


async def test_watchdog_declares_a_hung_collection(http: aiohttp.ClientSession) -> None:
    backend = HangingBackend()
    async with make_exporter(
        backend, interval_s=0.05, unhealthy_after=2, collect_timeout_s=0.1
    ) as ex:
        backend.hang.set()
        await wait_for(lambda: ex.health()[0] is False, "two hung collections", timeout_s=20)
        calls = backend.calls
        _, _, body = await get(http, ex, "/metrics")
        fam = families(body.decode())
        assert "DCGM_FI_DEV_GPU_TEMP" not in fam
        hung = [
            v for lbl, v in fam["raven_gpu_exporter_collections_total"] if lbl["result"] == "hung"
        ]
        assert hung and hung[0] >= 2
        assert (await get(http, ex, "/healthz"))[0] == 503
        await asyncio.sleep(0.3)
        assert backend.calls == calls  # never a second collection while one hangs
        backend.hang.clear()
        backend.release.set()
        await wait_for(
            lambda: backend.calls > calls and ex.ready()[0], "a fresh collection", timeout_s=20
        )
        assert ex.health()[0]


async def test_collection_loop_refreshes() -> None:
    now = [1_763_780_000.0]
    async with make_exporter(
        SimulatedBackend(1, load_profile="bursty"), interval_s=0.05, clock=lambda: now[0]
    ) as ex:
        first = ex.snapshot
        assert first is not None
        now[0] += 10.0
        await wait_for(
            lambda: ex.snapshot is not None and ex.snapshot.timestamp == first.timestamp + 10.0,
            "a collection at the new time",
            timeout_s=20,
        )


def parse_cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return parser.parse_args(argv)


def test_cli_flags() -> None:
    args = parse_cli(
        [
            "gpu-exporter",
            "--simulate",
            "3",
            "-a",
            "127.0.0.1:9555",
            "-c",
            "2000",
            "--model",
            "A100",
            "--seed",
            "4",
            "--load-profile",
            "bursty",
            "--hostname",
            "n7",
            "--hostname-label",
            "hostname",
            "-k",
        ]
    )
    ex = cli.build_exporter(args)
    assert (ex.host, ex.port, ex.interval_s) == ("127.0.0.1", 9555, 2.0)
    assert ex.options == ExpositionOptions(
        hostname="n7", hostname_label="hostname", kubernetes=True, node_name="n7"
    )
    assert (ex.unhealthy_after, ex.collect_timeout_s) == (3, 10.0)
    args2 = parse_cli(
        ["gpu-exporter", "--simulate", "2", "--model", "H100", "--sharing", "mig",
         "--label-mode", "ack", "--per-process", "--unhealthy-after", "5",
         "--collect-timeout", "2500", "--gpu-mem-unit", "512"]
    )  # fmt: skip
    ex2 = cli.build_exporter(args2)
    assert ex2.options.label_mode == "ack" and ex2.options.per_process
    assert (ex2.unhealthy_after, ex2.collect_timeout_s) == (5, 2.5)
    assert isinstance(ex2.backend, SimulatedBackend) and ex2.backend.sharing == "mig"
    assert (
        isinstance(ex.backend, SimulatedBackend)
        and ex.backend.count == 3
        and ex.backend.model.key == "A100"
    )
    assert args.func is cli.run
    assert cli.parse_address(":9400") == ("", 9400)
    assert cli.parse_address("[::1]:9401") == ("::1", 9401)
    for bad in ("9400", "host:port", "h:70000"):
        with pytest.raises(ValueError):
            cli.parse_address(bad)


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "c.csv"
    bad.write_text("DCGM_FI_DEV_GPU_TEMP, histogram, t\n")
    args = parse_cli(["gpu-exporter", "--simulate", "1", "-f", str(bad)])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert f"{bad}:1: unknown metric type 'histogram'" in err
    args = parse_cli(["gpu-exporter", "--simulate", "1", "-c", "5"])
    assert cli.run(args) == 2
    assert "--collect-interval" in capsys.readouterr().err
    assert cli.run(parse_cli(["gpu-exporter", "--simulate", "1", "--model", "V200"])) == 2
    assert "unknown GPU model 'V200'" in capsys.readouterr().err
    args = parse_cli(["gpu-exporter", "--simulate", "1", "--model", "T4", "--sharing", "mig"])
    assert cli.run(args) == 2
    assert "has no MIG" in capsys.readouterr().err
    assert cli.run(parse_cli(["gpu-exporter", "--simulate", "1", "-a", "nowhere"])) == 2
    assert "HOST:PORT" in capsys.readouterr().err


def test_cli_without_nvml_names_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVML")
    except pynvml.NVMLError:
        pass
    assert cli.run(parse_cli(["gpu-exporter", "-a", "127.0.0.1:0"])) == 2
    err = capsys.readouterr().err
    assert "install the NVIDIA driver" in err and "--simulate" in err


@pytest.fixture
def cli_process() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpu_exporter",  # its own entry point, the flags of `raven gpu-exporter`
            "--simulate",
            "2",
            "-a",
            f"127.0.0.1:{port}",
            "-c",
            "200",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_cli_process_serves_and_stops_on_sigterm(
    cli_process: tuple[subprocess.Popen[bytes], int],
) -> None:
    import urllib.request

    proc, port = cli_process
    deadline = time.monotonic() + 15
    body = b""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                body = r.read()
                break
        except OSError:
            time.sleep(0.1)
    assert b'DCGM_FI_DEV_GPU_TEMP{gpu="1"' in body
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


def test_pod_resources_over_a_real_grpc_unix_socket(tmp_path: Path) -> None:
    grpc = pytest.importorskip("grpc")
    from concurrent import futures

    pods = [
        PodResources("trainer-0", "ml", (ContainerDevices("main", "nvidia.com/gpu", ("GPU-aaa",)),))
    ]
    payload = encode_list_response(pods)
    seen: list[bytes] = []

    def list_handler(request: bytes, context: object) -> bytes:
        seen.append(request)
        return payload

    handler = grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister",
        {
            "List": grpc.unary_unary_rpc_method_handler(
                list_handler, request_deserializer=None, response_serializer=None
            )
        },
    )
    assert LIST_METHOD == "/v1.PodResourcesLister/List"
    sock = tmp_path / "kubelet.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    client = PodResourcesClient(sock, timeout_s=5)
    try:
        assert client.available()
        assert client.list() == pods
        assert client.list() == pods
        assert seen == [b"", b""]
    finally:
        client.close()
        server.stop(None)
    missing = PodResourcesClient(tmp_path / "nope.sock", timeout_s=0.5)
    assert not missing.available()
    with pytest.raises(PodResourcesError, match="does not exist"):
        missing.list()
    missing.close()


async def test_embedded_exporter_for_the_agent() -> None:
    from dataclasses import dataclass

    from gpu_exporter.embed import start_embedded_exporter

    @dataclass(frozen=True)
    class Config:  # the fields of raven.config.agent.GpuExporterConfig
        listen: str = "127.0.0.1:0"
        simulate: int = 2
        model: str = "NVIDIA H100 80GB HBM3"
        seed: int = 1
        hostname: str | None = "edge-gpu-9"
        sharing: str = "time-slicing"
        interval_s: float = 30.0
        kubernetes: bool = True
        pod_resources_socket: str = "/nonexistent/kubelet.sock"
        label_mode: str = "ack"
        per_process: bool = False

    exporter = await start_embedded_exporter(Config())
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{exporter.port}/metrics") as r,
        ):
            text = await r.text()
        assert r.status == 200
        assert 'Hostname="edge-gpu-9"' in text and 'gpu="1"' in text
        # the same exporter as the standalone one: ACK labels, three pods per shared GPU
        assert 'NodeName="edge-gpu-9"' in text
        assert text.count("DCGM_CUSTOM_CONTAINER_MEM_ALLOCATED{") == 6
    finally:
        await exporter.stop()
    with pytest.raises(ValueError, match="unknown GPU model"):
        await start_embedded_exporter(Config(model="Voodoo 2"))
