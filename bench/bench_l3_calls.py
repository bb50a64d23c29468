"""L3: the Python calls one ping costs each Raven process, counted in the real processes.

On a small VM whose idle CPUs sleep, a lone packet's pass through the interpreter is paid cold,
so how many calls a packet makes, and which, is the first thing to read when the L3 ping moves
(docs/benchmarks-history.md, "Ninth round" to "Twelfth round"). The count does not drift with the machine
as the ping does: it compares two trees exactly.

The lab of bench_l3.py (cloud host, ``raven gateway``, ``raven agent`` with ``tun.enabled``,
edge host) with a counting hook in both Raven processes: a ``sitecustomize`` module, put on
their ``PYTHONPATH`` from a temporary folder, installs ``sys.setprofile`` on SIGUSR1 and
writes its counts on SIGUSR2. After a warm-up, the driver signals both, sends ``--pings``
pings (one per 5 ms), signals again and prints, per process, the Python and C calls per ping
and the functions called at least ``--min`` times per ping. The hook itself slows the
processes: read the counts, not the times. Needs root::

    sudo .venv/bin/python bench/bench_l3_calls.py [--pings 300] [--min 0.5] [--root DIR]

``--root`` counts another checkout (e.g. a ``git worktree`` of an older commit).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

HOOK = """
import collections, json, os, signal, sys
_out = os.environ["RAVEN_CALLS_DIR"]
_callers = os.environ.get("RAVEN_CALLS_CALLERS") == "1"  # a C call keyed by its caller too
_counts = collections.Counter()
def _hook(frame, event, arg):
    if event == "call":
        code = frame.f_code
        _counts[f"{code.co_filename}:{code.co_firstlineno}:{code.co_qualname}"] += 1
    elif event == "c_call":
        key = "C:" + str(getattr(arg, "__qualname__", arg))
        _counts[key + " <- " + frame.f_code.co_qualname if _callers else key] += 1
def _start(signum, frame):
    _counts.clear()
    sys.setprofile(_hook)
def _stop(signum, frame):
    sys.setprofile(None)
    with open(os.path.join(_out, f"{os.getpid()}.json"), "w") as f:
        json.dump(_counts, f)
signal.signal(signal.SIGUSR1, _start)
signal.signal(signal.SIGUSR2, _stop)
"""


def print_counts(
    counts: dict[str, dict[str, int]], n: int, unit: str, minimum: float, root: Path
) -> None:
    """Per process: the Python and C calls per ``unit`` (``n`` of them), then a table of
    the functions called at least ``minimum`` times per ``unit``."""
    for name, calls in counts.items():
        python = sum(c for key, c in calls.items() if not key.startswith("C:"))
        native = sum(calls.values()) - python
        print(f"**{name}**: {python / n:.1f} Python calls per {unit}, {native / n:.1f} C calls\n")
        print(f"| calls per {unit} | function |")
        print("|---|---|")
        for key, c in sorted(calls.items(), key=lambda kv: -kv[1]):
            if c / n >= minimum:
                print(f"| {c / n:.2f} | `{key.replace(str(root) + '/', '')}` |")
        print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pings", type=int, default=300)
    parser.add_argument("--min", type=float, default=0.5, help="list functions called this often")
    parser.add_argument("--root", type=Path, default=REPO, help="the checkout to count")
    args = parser.parse_args()
    root = args.root.resolve()
    sys.path.insert(0, str(root))
    import tests.helpers.e2e.l3_lab as l3
    from tests.helpers.e2e.netns import Lab, missing_prerequisites

    problems = missing_prerequisites(())
    if problems:
        print("bench_l3_calls: " + "; ".join(problems), file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-l3-calls-") as tmp:
        hook_dir, out_dir, lab_dir = Path(tmp, "hook"), Path(tmp, "out"), Path(tmp, "lab")
        for folder in (hook_dir, out_dir, lab_dir):
            folder.mkdir()
        (hook_dir / "sitecustomize.py").write_text(HOOK)
        pythonpath = f"{hook_dir}:{root}:{root / 'coredns-hosts'}"
        l3.ENV = {**l3.ENV, "PYTHONPATH": pythonpath, "RAVEN_CALLS_DIR": str(out_dir)}
        with Lab(lab_dir) as lab:
            t = l3.L3Lab.build(lab, "raven")
            t.start()
            l3.ping(t.cloud, "192.168.50.7", 50, interval_s=0.005)  # warm-up
            procs = {"gateway": t.gateway, "agent": t.agent_proc}
            for proc in procs.values():
                assert proc is not None
                os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(0.2)
            rtts = l3.ping(t.cloud, "192.168.50.7", args.pings, interval_s=0.005)
            for proc in procs.values():
                assert proc is not None
                os.kill(proc.pid, signal.SIGUSR2)
            time.sleep(0.5)
            counts = {
                name: json.loads((out_dir / f"{proc.pid}.json").read_text())
                for name, proc in procs.items()
                if proc is not None
            }
            t.stop()
    pings = len(rtts)
    print(f"`bench/bench_l3_calls.py --pings {args.pings}` ({root}): {pings} pings answered\n")
    print_counts(counts, pings, "ping", args.min, root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
