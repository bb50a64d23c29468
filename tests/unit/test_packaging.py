"""Raven builds like any other package: a wheel and an sdist with `python -m build` that pass
`twine check`, carrying the license, the data files and the `raven` command."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from raven.version import version

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_and_sdist_build_and_pass_twine_check(tmp_path: Path) -> None:
    build = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    output = build.stdout + build.stderr
    assert "Deprecat" not in output, output[-3000:]
    wheels = list(tmp_path.glob("raven_edge-*.whl"))
    sdists = list(tmp_path.glob("raven_edge-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(tmp_path.iterdir())
    assert wheels[0].name.endswith("-py3-none-any.whl"), wheels[0].name  # pure by default
    check = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheels[0]), str(sdists[0])],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("PASSED") == 2
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
        metadata = next(wheel.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
        entry_points = next(wheel.read(n).decode() for n in names
                            if n.endswith(".dist-info/entry_points.txt"))  # fmt: skip
    for package in (
        "raven",
        "raven_cli",
        "cloud_gateway",
        "edge_agent",
        "gpu_exporter",
        "coredns_hosts",
    ):
        assert f"{package}/__init__.py" in names, package
    assert "cloud_gateway/web/status.html" in names
    assert "gpu_exporter/default-counters.csv" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "Name: raven-edge" in metadata
    assert f"Version: {version()}\n" in metadata  # read from raven/version.py
    assert "License-Expression: Apache-2.0" in metadata
    assert "raven = raven_cli.main:main" in entry_points
    with tarfile.open(sdists[0]) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    assert {"LICENSE", "README.md", "pyproject.toml"} <= members


#: Run from the unpacked compiled wheel: a Noise IK handshake and a transport message each way
#: and an IPv4 packet parsed, through its extension modules (and proof that they are the ones
#: loaded).
_COMPILED_SMOKE = """
import raven.protocol.mux as mux, raven.protocol.noise as noise, raven.l3.packet as packet
from raven.protocol.noise_crypto import generate_keypair
for module in (mux, noise, packet):
    assert module.__file__.endswith(".so"), module.__file__
name = "Noise_IK_25519_ChaChaPoly_BLAKE2s"
(i_priv, _), (r_priv, r_pub) = generate_keypair(), generate_keypair()
i = noise.HandshakeState.initialize(name, initiator=True, s=i_priv, rs=r_pub)
r = noise.HandshakeState.initialize(name, initiator=False, s=r_priv)
assert r.read_message(i.write_message(b"hello")) == b"hello"
assert i.read_message(r.write_message(b"back")) == b"back"
(i_send, i_recv), (r_recv, r_send) = i.split(), r.split()
assert r_recv.decrypt_with_ad(b"", i_send.encrypt_with_ad(b"", b"up")) == b"up"
assert i_recv.decrypt_with_ad(b"", r_send.encrypt_with_ad(b"", b"down")) == b"down"
udp = bytes([0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]) + bytes(8)
info = packet.parse_packet(udp)
assert (info.version, info.protocol, info.length, info.dst) == (4, 17, 28, 0x0A000002), info
import cloud_gateway.proxy.heads as heads, raven.transport.tunnel as tunnel
for module in (heads, tunnel):  # the hot path's adapters (setup.py HOT_PATH)
    assert module.__file__.endswith(".so"), module.__file__
head = heads.parse_request_head(b"GET /metrics HTTP/1.1\\r\\nHost: edge-1:9400\\r\\n\\r\\n")
assert (head.method, head.host, head.keep_alive) == ("GET", "edge-1:9400", True), head
print("compiled core ok")
"""


def test_wheel_with_the_compiled_core(tmp_path: Path) -> None:
    """RAVEN_COMPILE=1: the sdist builds a platform wheel whose core and hot path carry mypyc
    extension modules (the runtime they share inside raven/protocol) and, beside them, the .py
    files as the fallback; the unpacked wheel runs a handshake and parses a request on them."""
    out = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=900, env={**os.environ, "RAVEN_COMPILE": "1"},
    )  # fmt: skip
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-3000:]
    (wheel,) = out.glob("raven_edge-*.whl")
    assert "-cp3" in wheel.name and "linux" in wheel.name, wheel.name  # a platform wheel
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "site")
    extensions = {n.split("/")[-1].split(".")[0] for n in names if n.endswith(".so")}
    compiled_dirs = ("raven/protocol/", "raven/l3/", "raven/transport/", "cloud_gateway/proxy/")
    sources = {n.split("/")[-1][:-3] for n in names
               if n.startswith(compiled_dirs) and n.endswith(".py")}  # fmt: skip
    core = {"mux", "connection", "records", "noise", "packet", "prefixes", "_core__mypyc"}
    hot = {"tunnel", "splice", "heads", "response_relay"}  # setup.py HOT_PATH
    assert core | hot <= extensions
    assert not {"frames", "events", "limits"} & extensions  # stay pure (setup.py)
    assert not {"websocket_transport", "tun", "server"} & extensions  # off the hot path
    assert extensions - {"_core__mypyc"} <= sources  # every compiled module keeps its .py
    assert all(n.startswith(compiled_dirs) for n in names if n.endswith(".so"))
    smoke = subprocess.run(
        [sys.executable, "-c", _COMPILED_SMOKE], cwd=tmp_path, capture_output=True, text=True,
        timeout=60, env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
    )  # fmt: skip
    assert smoke.returncode == 0, smoke.stderr
    assert "compiled core ok" in smoke.stdout
