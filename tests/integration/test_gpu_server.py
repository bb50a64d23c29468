"""The exporter over loopback HTTP: routes, gzip, failure isolation, CLI, pod-resources gRPC."""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter import cli
from gpu_exporter.backend import PodRef, Snapshot
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
from tests.helpers import free_port

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


async def test_failed_collection_keeps_last_snapshot(http: aiohttp.ClientSession) -> None:
    backend = FlakyBackend()
    async with make_exporter(backend, interval_s=0.05) as ex:
        status, _, _ = await get(http, ex, "/metrics")
        assert status == 200
        backend.fail = True
        await asyncio.sleep(0.4)
        status, _, body = await get(http, ex, "/metrics")
        assert status == 200
        fam = families(body.decode())
        assert fam["DCGM_FI_DEV_GPU_TEMP"]  # still the last good snapshot
        errors = [
            v for lbl, v in fam["raven_gpu_exporter_collections_total"] if lbl["result"] == "error"
        ]
        assert errors and errors[0] >= 2
        status, _, text = await get(http, ex, "/health")
        assert status == 503 and b"driver wedged" in text
        # the project-wide probes: alive, but not ready while collection fails
        assert (await get(http, ex, "/readyz"))[0] == 503
        assert (await get(http, ex, "/healthz"))[0] == 200
        backend.fail = False
        await asyncio.sleep(0.2)
        status, _, _ = await get(http, ex, "/health")
        assert status == 200


async def test_collection_loop_refreshes() -> None:
    now = [1_763_780_000.0]
    async with make_exporter(
        SimulatedBackend(1, load_profile="bursty"), interval_s=0.05, clock=lambda: now[0]
    ) as ex:
        first = ex.snapshot
        now[0] += 10.0
        await asyncio.sleep(0.3)
        assert ex.snapshot is not None and first is not None
        assert ex.snapshot.timestamp == first.timestamp + 10.0


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
    bad.write_text("DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_BOGUS, gauge, x\n")
    assert (
        parse_cli(["gpu-exporter", "--simulate", "1", "-f", str(bad)]).func(
            parse_cli(["gpu-exporter", "--simulate", "1", "-f", str(bad)])
        )
        == 2
    )
    err = capsys.readouterr().err
    assert f"{bad}:2: unknown or unsupported field 'DCGM_FI_BOGUS'" in err
    args = parse_cli(["gpu-exporter", "--simulate", "1", "-c", "5"])
    assert cli.run(args) == 2
    assert "--collect-interval" in capsys.readouterr().err
    assert cli.run(parse_cli(["gpu-exporter", "--simulate", "1", "--model", "V100"])) == 2
    assert "unknown GPU model 'V100'" in capsys.readouterr().err
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


RUNNER = (
    "import sys, argparse\nfrom gpu_exporter import cli\np = argparse.ArgumentParser()\n"
    "cli.register(p.add_subparsers())\na = p.parse_args(sys.argv[1:])\nsys.exit(a.func(a))\n"
)


@pytest.fixture
def cli_process() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            RUNNER,
            "gpu-exporter",
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
        assert client.allocations() == {"GPU-aaa": PodRef("ml", "trainer-0", "main")}
        assert seen == [b"", b""]
    finally:
        client.close()
        server.stop(None)
    missing = PodResourcesClient(tmp_path / "nope.sock", timeout_s=0.5)
    assert not missing.available()
    with pytest.raises(PodResourcesError, match="failed"):
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

    exporter = await start_embedded_exporter(Config())
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{exporter.port}/metrics") as r,
        ):
            text = await r.text()
        assert r.status == 200
        assert 'Hostname="edge-gpu-9"' in text and 'gpu="1"' in text
    finally:
        await exporter.stop()
    with pytest.raises(ValueError, match="unknown GPU model"):
        await start_embedded_exporter(Config(model="Voodoo 2"))
