"""L7: the Python calls one scrape costs each Raven process, counted in the real processes.

The ``tunnel`` path of bench_l7.py (wrk -> ``raven gateway`` ==tunnel==> ``raven agent`` ->
nginx serving the 100 KB page) with the counting hook of bench_l3_calls.py in both Raven
processes (a ``sitecustomize`` on their ``PYTHONPATH``: ``sys.setprofile`` from SIGUSR1 to
SIGUSR2). After a warm-up, the driver signals both, runs wrk for ``--seconds`` at ``--conns``
connections, signals again and prints, per process, the Python and C calls per request and
the functions called at least ``--min`` times per request. The hook slows the processes a
lot: read the counts, not the times. Counts per request do not drift with the machine as
req/s does, so two trees compare exactly (``--root``: a ``git worktree`` of another commit)::

    .venv/bin/python bench/bench_l7_calls.py [--seconds 3] [--conns 16] [--min 0.5] [--root DIR]
                                             [--callers]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--conns", type=int, default=16)
    parser.add_argument("--min", type=float, default=0.5, help="list functions called this often")
    parser.add_argument("--root", type=Path, default=REPO, help="the checkout to count")
    parser.add_argument("--callers", action="store_true",
                        help="count each C call (len, dict.get, ...) by the function calling it")  # fmt: skip
    args = parser.parse_args()
    root = args.root.resolve()
    sys.path.insert(0, str(REPO / "bench"))  # the harness is this checkout's; the processes root's
    import bench_l3_calls
    import bench_l7 as l7

    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="bench-l7-calls-") as tmp_name:
        tmp = Path(tmp_name)
        tmp.chmod(0o755)
        hook_dir, out_dir = tmp / "hook", tmp / "out"
        hook_dir.mkdir()
        out_dir.mkdir()
        (hook_dir / "sitecustomize.py").write_text(bench_l3_calls.HOOK)
        (tmp / "metrics").write_bytes(l7.metrics_page())
        env = {**os.environ, "PYTHONPATH": f"{hook_dir}:{root}", "RAVEN_CALLS_DIR": str(out_dir),
               "RAVEN_CALLS_CALLERS": "1" if args.callers else "0"}  # fmt: skip
        try:
            target_port = l7.free_port()
            procs.append(l7.start_nginx(tmp, "target", target_port,
                         f"location = /metrics {{ root {tmp}; default_type text/plain; }}"))  # fmt: skip
            gw_conf, agent_conf, port = l7.write_tunnel_configs(tmp, target_port, None, 256)
            # older trees (before the composition roots left the library): raven.cli
            module = "raven_cli.main" if (root / "raven_cli").is_dir() else "raven.cli"
            cli = [sys.executable, "-m", module]
            gateway = subprocess.Popen([*cli, "gateway", "-c", str(gw_conf)], cwd=root, env=env)
            procs.append(gateway)
            l7.wait_port(port)
            agent = subprocess.Popen([*cli, "agent", "-c", str(agent_conf)], cwd=root, env=env)
            procs.append(agent)
            l7.wait_tunnel_up(port, target_port)
            url, host = f"http://127.0.0.1:{port}/metrics", f"{l7.NODE}:{target_port}"
            l7.run_wrk(url, args.conns, 1, host)  # warm-up
            named = {"gateway": gateway, "agent": agent}
            for proc in named.values():
                os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(0.2)
            out, _ = l7.run_wrk(url, args.conns, args.seconds, host)
            for proc in named.values():
                os.kill(proc.pid, signal.SIGUSR2)
            time.sleep(1.0)
            counts = {
                n: json.loads((out_dir / f"{p.pid}.json").read_text()) for n, p in named.items()
            }
        finally:
            l7.stop_all(procs)
    match = re.search(r"(\d+) requests in", out)
    requests = int(match.group(1)) if match else 0
    if not requests:
        print("bench_l7_calls: wrk completed no request\n" + out, file=sys.stderr)
        return 1
    print(f"`bench/bench_l7_calls.py --seconds {args.seconds:g} --conns {args.conns}` ({root}): "
          f"{requests} requests\n")  # fmt: skip
    bench_l3_calls.print_counts(counts, requests, "request", args.min, root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
