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
