"""The compose stack's own config files, run natively: the same `raven` command lines the
containers run (read from docker-compose.yml), the configs rendered by compose/gen_keys.py,
in a network namespace of their own so the stack's fixed ports (10262-10266) are free.

No Docker engine runs here; this proves the config files and commands the stack mounts work.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import require

ROOT = Path(__file__).resolve().parents[2]
NODES = {"edge-gpu-1": "127.0.0.11", "edge-gpu-2": "127.0.0.12",
         "edge-gpu-3": "127.0.0.13", "edge-gpu-4": "127.0.0.14"}  # fmt: skip


def compose_command(service: str) -> list[str]:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = doc["services"][service]["command"]
    assert isinstance(command, list)
    return [str(c) for c in command]


class Netns:
    def __init__(self, name: str) -> None:
        self.name = name
        subprocess.run(["ip", "netns", "add", name], check=True)
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def start(self, label: str, argv: list[str], logdir: Path) -> None:
        log = logdir / f"{label}.log"
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.name, *argv],
            stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=logdir,
        )  # fmt: skip
        self.procs.append((label, proc, log))

    def get(self, url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        code = (
            "import sys, urllib.request, urllib.error\n"
            "hdrs = dict(h.split(': ', 1) for h in sys.argv[2:])\n"
            "req = urllib.request.Request(sys.argv[1], headers=hdrs)\n"
            "try:\n"
            "    r = urllib.request.urlopen(req, timeout=5)\n"
            "    print(r.status); print(r.read().decode())\n"
            "except urllib.error.HTTPError as e:\n    print(e.code); print(e.read().decode())\n"
            "except OSError as e:\n    print(0); print(e)\n"
        )
        hdrs = [f"{k}: {v}" for k, v in (headers or {}).items()]
        out = subprocess.run(
            ["ip", "netns", "exec", self.name, sys.executable, "-c", code, url, *hdrs],
            capture_output=True, text=True, timeout=20,
        ).stdout  # fmt: skip
        status, _, body = out.partition("\n")
        return int(status or 0), body

    def close(self) -> None:
        for _, proc, _ in self.procs:
            proc.terminate()
        for _, proc, _ in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        subprocess.run(["ip", "netns", "del", self.name], check=False)

    def logs(self) -> str:
        return "\n".join(f"--- {label}\n{log.read_text()[-1500:]}" for label, _, log in self.procs)


@pytest.fixture
def stack(tmp_path: Path):
    require(os.geteuid() == 0, "network namespaces need root")
    require(shutil.which("ip") is not None, "iproute2 not installed")
    shutil.copytree(ROOT / "compose" / "templates", tmp_path / "templates")
    overrides = {"KEY_DIR": str(tmp_path / "keys"), "GATEWAY_HOST": "127.0.0.1",
                 "AGENT_SITE_A_ADMIN_LISTEN": "127.0.0.1:10266",
                 "AGENT_SITE_B_ADMIN_LISTEN": "127.0.0.1:10276"}  # fmt: skip
    for i, (_, addr) in enumerate(NODES.items(), start=1):
        overrides[f"EDGE_GPU_{i}_ADDRESS"] = addr
    subprocess.run(
        [sys.executable, str(ROOT / "compose" / "gen_keys.py"), "--dir", str(tmp_path),
         *[a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]],
        check=True, capture_output=True,
    )  # fmt: skip
    ns = Netns(f"rvn-compose-{os.getpid()}")
    raven = [sys.executable, "-m", "raven_cli.main"]
    gen = tmp_path / "generated"
    try:
        for node, addr in NODES.items():
            # the containers listen on :9400 of their own address; natively each gets its own
            ns.start(node, [*raven, *compose_command(node), "-a", f"{addr}:9400",
                            "--hostname", node], tmp_path)  # fmt: skip
        gw_cmd = compose_command("gateway")
        ns.start("gateway", [*raven, *gw_cmd[:-1], str(gen / "gateway.yaml")], tmp_path)
        for site in ("site-a", "site-b"):
            cmd = compose_command(f"agent-{site}")
            ns.start(f"agent-{site}", [*raven, *cmd[:-1], str(gen / f"agent-{site}.yaml")],
                     tmp_path)  # fmt: skip
        yield ns
    finally:
        ns.close()


def test_compose_configs_run_natively(stack: Netns) -> None:
    deadline = time.monotonic() + 40
    status, body = 0, ""
    while time.monotonic() < deadline:
        status, body = stack.get("http://127.0.0.1:10265/api/v1/nodes")
        if status == 200 and body.count('"reachable": true') == len(NODES):
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"not every node registered: {status} {body}\n{stack.logs()}")
    for node in NODES:
        status, body = stack.get("http://127.0.0.1:10264/metrics", {"Host": f"{node}:9400"})
        assert status == 200, (node, status, body, stack.logs())
        assert "DCGM_FI_DEV_GPU_TEMP" in body and f'Hostname="{node}"' in body
        status, body = stack.get(f"http://127.0.0.1:10264/proxy/{node}:9400/metrics")
        assert status == 200
    # the compose Prometheus' http_sd job reads this
    status, body = stack.get("http://127.0.0.1:10265/api/v1/targets?port=9400")
    assert status == 200 and all(f'"{n}:9400"' in body for n in NODES)
    # both agents are ready on the admin ports their compose healthchecks probe
    for port in (10266, 10276):
        assert stack.get(f"http://127.0.0.1:{port}/readyz")[0] == 200
    # a name the compose gateway does not know: 404 with a reason, never a hang
    status, body = stack.get("http://127.0.0.1:10264/metrics", {"Host": "edge-gpu-9:9400"})
    assert status == 404
