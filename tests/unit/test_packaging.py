"""Raven builds like any other package: a wheel and an sdist with `python -m build` that pass
`twine check`, carrying the license, the data files and the `raven` command."""

from __future__ import annotations

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
    for package in ("raven", "cloud_gateway", "edge_agent", "gpu_exporter", "coredns_hosts"):
        assert f"{package}/__init__.py" in names, package
    assert "cloud_gateway/web/status.html" in names
    assert "gpu_exporter/default-counters.csv" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "Name: raven-edge" in metadata
    assert f"Version: {version()}\n" in metadata  # read from raven/version.py
    assert "License-Expression: Apache-2.0" in metadata
    assert "raven = raven.cli:main" in entry_points
    with tarfile.open(sdists[0]) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    assert {"LICENSE", "README.md", "pyproject.toml"} <= members
