"""The README's main job: `raven demo --check` scrapes every node in every mode."""

from __future__ import annotations

import subprocess
import sys


def test_demo_check_passes() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "raven.cli", "demo", "--check", "--sites", "2",
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


def test_demo_runs_and_stops_cleanly() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "raven.cli", "demo", "--duration-s", "4", "--sites", "1",
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
        [sys.executable, "-m", "raven.cli", "demo", "--base-port", "0", "--sites", "1",
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
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"raven-demo-{proc.pid}" not in ps
