"""The systemd units (deploy/systemd/) are valid for `systemd-analyze verify`, alone and with
the L3 drop-in; they start the real CLI with flags it accepts; they hold no capability unless
the L3 drop-in adds CAP_NET_ADMIN. `systemd-analyze verify` needs no running systemd."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from raven_cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
ANALYZE = shutil.which("systemd-analyze")
RAVEN = Path(sys.executable).parent / "raven"


def directives(path: Path) -> list[tuple[str, str]]:
    out = []
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.append((key.strip(), value.strip()))
    return out


def install(tmp_path: Path, unit: str, drop_in: bool) -> Path:
    """The unit (and the L3 drop-in) in a unit directory of their own, the raven path
    pointing at this environment's command."""
    text = (UNITS / unit).read_text().replace("/usr/local/bin/raven", str(RAVEN))
    (tmp_path / unit).write_text(text)
    if drop_in:
        (tmp_path / f"{unit}.d").mkdir()
        shutil.copy(UNITS / "l3.conf", tmp_path / f"{unit}.d" / "l3.conf")
    return tmp_path / unit


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze missing: run scripts/setup as root")
@pytest.mark.parametrize("unit", ["raven-agent.service", "raven-gateway.service"])
@pytest.mark.parametrize("drop_in", [False, True], ids=["plain", "with-l3"])
def test_unit_passes_systemd_analyze_verify(tmp_path: Path, unit: str, drop_in: bool) -> None:
    assert ANALYZE is not None and RAVEN.exists()
    path = install(tmp_path, unit, drop_in)
    env = {**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp_path}:"}
    proc = subprocess.run([ANALYZE, "verify", "--man=no", str(path)], capture_output=True,
                          text=True, env=env, timeout=60)  # fmt: skip
    # unknown keys are only warnings (exit 0): any output at all is a failure
    assert proc.returncode == 0 and proc.stdout + proc.stderr == "", proc.stdout + proc.stderr


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze missing: run scripts/setup as root")
def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    assert ANALYZE is not None
    path = install(tmp_path, "raven-agent.service", drop_in=False)
    path.write_text(path.read_text().replace("ProtectSystem=", "ProtectSytem="))
    proc = subprocess.run([ANALYZE, "verify", "--man=no", str(path)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert "Unknown key 'ProtectSytem'" in proc.stderr


@pytest.mark.parametrize("unit", ["raven-agent.service", "raven-gateway.service"])
def test_unit_commands_parse_with_the_real_cli(unit: str) -> None:
    parser = build_parser()
    commands = [v for k, v in directives(UNITS / unit) if k in ("ExecStart", "ExecStartPre")]
    assert len(commands) == 2
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "/usr/local/bin/raven"
        args = parser.parse_args(argv[1:])
        assert callable(args.func)


@pytest.mark.parametrize("unit", ["raven-agent.service", "raven-gateway.service"])
def test_least_privilege(unit: str) -> None:
    base = dict(directives(UNITS / unit))
    assert base["CapabilityBoundingSet"] == "" and base["AmbientCapabilities"] == ""
    assert base["DynamicUser"] == "yes" and base["NoNewPrivileges"] == "yes"
    assert base["ProtectSystem"] == "strict" and base["PrivateDevices"] == "yes"
    name, _, source = base["LoadCredential"].partition(":")
    assert source == f"/etc/raven/{name}"  # the key reaches the service only as a credential
    l3 = dict(directives(UNITS / "l3.conf"))
    assert l3["CapabilityBoundingSet"] == l3["AmbientCapabilities"] == "CAP_NET_ADMIN"
    assert l3["DeviceAllow"] == "/dev/net/tun rw"
