"""L3 ping side by side for two builds of Raven: the pure core against the compiled one.

bench_l3.py measures one build; a difference of a few per cent between two builds drowns in
this machine's drift between two runs. Here both builds share one lab (bench_l3.py's
namespaces and wireguard-go): phases alternate A, B, A, B..., each phase starts that build's
``raven gateway`` and ``raven agent`` and runs its pings in rounds alternating with
wireguard-go's, so every ratio is to wireguard-go in the same minute.

- A: this checkout (its build as it is: pure unless ``scripts/build-compiled`` ran);
- B: a copy of this checkout compiled with ``scripts/build-compiled`` (mypyc), or with
  ``--tree-b PATH`` another checkout as it is (a branch, an older commit).

Prints, per build, the median of the per-round ratios to wireguard-go's p50, the p50 itself
and the CPU of both processes per ping. Needs root, wireguard-go and wg, and for the compiled
copy a C compiler (``sudo scripts/setup --bench``)::

    sudo .venv/bin/python bench/bench_l3_ab.py [--phases 12] [--pings 400] [--tree-b PATH]
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args()
    problems = missing_prerequisites(("wireguard-go", "wg"))
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
    labels = {k: f"{tree} (core {core_build(tree)})" for k, tree in trees.items()}
    results = {k: bench_l3.Result(k) for k in trees}
    (workdir / "lab").mkdir()
    with Lab(workdir / "lab") as lab:
        topo = l3.L3Lab.build(lab, "raven")
        bench_l3.add_wireguard_site(topo)
        wireguard: list[Proc] = []
        for phase in range(args.phases):
            key = "AB"[phase % 2]
            print(f"phase {phase + 1}/{args.phases}: {key}", file=sys.stderr)
            l3.ENV.update(python_env(trees[key]))  # the processes import this tree
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
