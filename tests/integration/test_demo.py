"""The README's main job: `raven demo --check` scrapes every node in every mode."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="prometheus missing: run scripts/setup as root")  # fmt: skip
def test_demo_check_passes() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "raven_cli.main", "demo", "--check", "--sites", "2",
         "--nodes-per-site", "2"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 failed" in proc.stdout
    # every node, every addressing mode
    for node in ("site-a-gpu-1", "site-a-gpu-2", "site-b-gpu-1", "site-b-gpu-2"):
        for mode in ("dns", "proxy", "path", "connect"):
            assert any(
                line.startswith("ok") and node in line and f" {mode} " in line
                for line in proc.stdout.splitlines()
            ), f"{node} {mode} missing"
    # the real Prometheus scraped every node by name, in DNS mode and through proxy_url
    assert "ok   prometheus job edge-gpu-dns: 4/4 targets up by name" in proc.stdout
    assert "ok   prometheus job edge-gpu-proxy: 4/4 targets up by name" in proc.stdout
    assert "ok   status page http://" in proc.stdout


def test_demo_runs_and_stops_cleanly() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "raven_cli.main", "demo", "--duration-s", "4", "--sites", "1",
         "--nodes-per-site", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "scrapes/s" in proc.stdout
    assert "site-a" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_demo_stops_cleanly_on_ctrl_c() -> None:
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "raven_cli.main", "demo", "--base-port", "0", "--sites", "1",
         "--nodes-per-site", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if "scrapes/s" in line or not line:
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "stopping" in out
    assert "Traceback" not in err
    # the hosts generator child went with it
    ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"raven-demo-{proc.pid}" not in ps


def test_demo_view_refreshes_in_place_on_a_terminal() -> None:
    import os
    import select
    import signal

    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "raven_cli.main", "demo", "--base-port", "0", "--sites", "1",
         "--nodes-per-site", "1", "--no-prometheus"],
        stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    os.close(slave)
    out = b""
    try:
        for _ in range(600):  # until two frames were drawn (bounded by the loop count)
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                out += os.read(master, 65536)
            if out.count(b"Ctrl-C stops") >= 2:
                break
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    text = out.decode(errors="replace")
    assert text.count("\x1b[H\x1b[J") >= 2  # each frame redraws from the top
    frame = text.rsplit("\x1b[H\x1b[J", 1)[1]
    assert frame.startswith("Raven demo ")
    assert "Gateway status page:" in frame and "\nTry:\r\n" in frame
    assert " ms " in frame.split("site-a  up", 1)[1].splitlines()[0]  # RTT in ms, sub-ms digits
    assert not frame.endswith("\n")  # the last line never scrolls the screen
