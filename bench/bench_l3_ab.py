"""L3 ping (and iperf3) side by side for two builds of Raven: two checkouts, or the pure core
against the compiled one.

bench_l3.py measures one build; a difference of a few per cent between two builds drowns in
this machine's drift between two runs. Here both builds share one lab (bench_l3.py's
namespaces and wireguard-go): phases alternate A, B, A, B..., each phase starts that build's
``raven gateway`` and ``raven agent`` and runs its pings in rounds alternating with
wireguard-go's, so every ratio is to wireguard-go in the same minute.

- A: this checkout (its build as it is: pure unless ``scripts/build-compiled`` ran);
- B: a copy of this checkout compiled with ``scripts/build-compiled`` (mypyc), or with
  ``--tree-b PATH`` another checkout as it is (a branch, an older commit).

Prints, per build, the median of the per-round ratios to wireguard-go's p50, the p50 itself
and the CPU of both processes per ping; with ``--iperf SECONDS`` also one iperf3 TCP stream
cloud -> edge per phase, through the build and through wireguard-go (their order alternating),
and the median of those throughput ratios. Needs root, wireguard-go and wg, and for the compiled
copy a C compiler (``sudo scripts/setup --bench``)::

    sudo .venv/bin/python bench/bench_l3_ab.py [--phases 12] [--pings 400] [--tree-b PATH]
        [--iperf 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import bench_l3  # noqa: E402

import tests.helpers.e2e.l3_lab as l3  # noqa: E402
from tests.helpers import python_env  # noqa: E402
from tests.helpers.e2e.netns import Lab, Proc, missing_prerequisites  # noqa: E402

#: What a copy of the checkout needs to run and to compile (no .git, no caches, no builds).
SKIP = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.so", ".mypy_cache", "build")


def compiled_copy(workdir: Path) -> Path:
    """A copy of this checkout with its core compiled in place (scripts/build-compiled)."""
    tree = workdir / "compiled"
    shutil.copytree(REPO, tree, ignore=SKIP)
    (tree / ".venv").symlink_to(REPO / ".venv")
    subprocess.run([str(tree / "scripts" / "build-compiled")], check=True)
    return tree


def cli_command(tree: Path) -> list[str]:
    """The tree's own ``raven`` command (older checkouts kept it in raven/cli.py)."""
    module = "raven_cli.main" if (tree / "raven_cli" / "main.py").exists() else "raven.cli"
    return [sys.executable, "-m", module]


def core_build(tree: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-c", "from raven.version import core_build; print(core_build())"],
        cwd=tree, env={**l3.ENV, **python_env(tree)}, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    return out.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", type=int, default=12, help="alternating A/B phases")
    parser.add_argument("--pings", type=int, default=400, help="per phase, in 6 rounds")
    parser.add_argument("--tree-b", type=Path, help="another checkout instead of a compiled copy")
    parser.add_argument("--iperf", type=float, default=0.0,
                        help="seconds of iperf3 per build and phase (0: pings only)")  # fmt: skip
    args = parser.parse_args()
    problems = missing_prerequisites(("wireguard-go", "wg", *(("iperf3",) if args.iperf else ())))
    if problems:
        print("bench_l3_ab: " + "; ".join(problems), file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="bench-l3-ab-"))
    try:
        return run(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run(args: argparse.Namespace, workdir: Path) -> int:
    trees = {"A": REPO, "B": args.tree_b.resolve() if args.tree_b else compiled_copy(workdir)}
    # `python -m` puts the working directory first on sys.path: outside both checkouts, each
    # process imports the tree its PYTHONPATH names (from this checkout, B imported A's code)
    os.chdir(workdir)
    labels = {k: f"{tree} (core {core_build(tree)})" for k, tree in trees.items()}
    results = {k: bench_l3.Result(k) for k in trees}
    #: per build: its iperf3 Mbit/s and the ratio to wireguard-go's in the same phase
    mbps: dict[str, list[float]] = {k: [] for k in trees}
    ratios: dict[str, list[float]] = {k: [] for k in trees}
    (workdir / "lab").mkdir()
    with Lab(workdir / "lab") as lab:
        topo = l3.L3Lab.build(lab, "raven")
        bench_l3.add_wireguard_site(topo)
        wireguard: list[Proc] = []
        for phase in range(args.phases):
            key = "AB"[phase % 2]
            print(f"phase {phase + 1}/{args.phases}: {key}", file=sys.stderr)
            l3.ENV.update(python_env(trees[key]))  # the processes import this tree
            l3.COMMAND = cli_command(trees[key])
            t = l3.L3Lab(lab, topo.cloud, topo.gw, topo.agent, topo.edge, "raven")
            t.start()
            if not wireguard:
                wireguard = bench_l3.start_wireguard(t)
            res = results[key]
            res.procs = [p for p in (t.gateway, t.agent_proc) if p]
            reference = bench_l3.Result("wireguard-go")
            bench_l3.measure_pings(
                t, [(res, bench_l3.RAVEN_HOST), (reference, bench_l3.WG_HOST)], args.pings, 6
            )
            if args.iperf:
                rates = throughput(t, args.iperf, reverse_order=phase % 4 >= 2)
                mbps[key].append(rates[0] / 1e6)
                ratios[key].append(rates[0] / rates[1])
            t.stop()
            for proc in res.procs:
                lab.procs.remove(proc)
            time.sleep(0.3)
    print(f"`bench/bench_l3_ab.py --phases {args.phases} --pings {args.pings}`\n")
    print("| build | per-round median ratio to wireguard-go | ping p50 | CPU µs per ping |")
    print("|---|---|---|---|")
    for key, res in results.items():
        print(
            f"| {key}: {labels[key]} | {statistics.median(res.round_ratio):.2f} "
            f"(n={len(res.round_ratio)}) | {statistics.median(res.rtt_ms):.3f} ms | "
            f"{res.cpu_ns / 1e3 / max(1, res.pings):.0f} |"
        )
    if args.iperf:
        print(f"\niperf3, 1 stream cloud -> edge, {args.iperf:g} s per build and phase\n")
        print("| build | per-phase median ratio to wireguard-go | Mbit/s (median) |")
        print("|---|---|---|")
        for key in trees:
            print(f"| {key} | {statistics.median(ratios[key]):.2f} (n={len(ratios[key])}, "
                  f"{min(ratios[key]):.2f}-{max(ratios[key]):.2f}) | "
                  f"{statistics.median(mbps[key]):.0f} |")  # fmt: skip
    return 0


def throughput(t: l3.L3Lab, seconds: float, *, reverse_order: bool) -> tuple[float, float]:
    """(bits/s through the build, through wireguard-go), one iperf3 stream each."""
    order = [bench_l3.RAVEN_HOST, bench_l3.WG_HOST]
    rates = {}
    for dst in order[::-1] if reverse_order else order:
        rates[dst] = l3.bps(l3.iperf(t.lab, t.cloud, t.edge, dst, streams=1, seconds=seconds))
    return rates[bench_l3.RAVEN_HOST], rates[bench_l3.WG_HOST]


if __name__ == "__main__":
    sys.exit(main())
