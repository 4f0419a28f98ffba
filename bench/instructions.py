"""Instructions per unit of queickd's work, counted by valgrind (callgrind), for one tree or
an A/B of several: the same count for the same input however busy the machine is, where a
timing on a shared VM drifts by 10 % between runs of the same tree. User-space instructions
only: what the kernel does (fsync, the WAL's writes) is not in them, nor waiting.

  python -m bench.instructions                          # this checkout, every probe
  python -m bench.instructions --tree /tmp/before --tree .   # A/B: ratios against the first
  python -m bench.instructions --only pass,pool --n 2000

Each probe (bench/instrprobes.py) runs in a fresh interpreter under valgrind twice, with N
and 3N units; the figure is the difference over 2N, so imports and setting up cancel out.
Every tree's probes run once natively first (its bytecode caches written, not counted).
Valgrind slows a run some 50 times: the defaults take a few minutes a tree.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

from .instrprobes import PROBES

_COLLECTED = re.compile(r"Collected : (\d+)")


def _run(tree: str, probe: str, n: int, valgrind: bool) -> int:
    """Instructions of one run (0 when run natively)."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}  # queickd from the tree, the probe from here
    cmd = [sys.executable, os.path.join(_here(), "instrprobes.py"), probe, str(n)]
    if valgrind:
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd]
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([*cmd, d], capture_output=True, text=True, env=env, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"{probe} on {tree} failed:\n{r.stderr[-2000:]}")
    if not valgrind:
        return 0
    m = _COLLECTED.search(r.stderr)
    if m is None:
        raise RuntimeError(f"valgrind gave no count for {probe} on {tree}:\n{r.stderr[-2000:]}")
    return int(m.group(1))


def _here() -> str:
    return os.path.dirname(os.path.abspath(__file__))


def per_unit(tree: str, probe: str, n: int) -> float:
    """Instructions per unit: (run of 3N - run of N) / 2N."""
    return (_run(tree, probe, 3 * n, True) - _run(tree, probe, n, True)) / (2 * n)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", help="a checkout holding queickd/ (repeat for an A/B; "
                   "default: this one); ratios are against the first")
    p.add_argument("--only", help=f"probes, comma-separated: {', '.join(PROBES)} (default: all)")
    p.add_argument("--n", type=int, default=1000, help="units in the shorter run (default 1000)")
    a = p.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind); nothing was counted", file=sys.stderr)
        return 2
    trees = a.tree or [os.path.dirname(_here())]
    probes = a.only.split(",") if a.only else list(PROBES)
    unknown = [x for x in probes if x not in PROBES]
    if unknown or a.n < 1:
        p.error(f"unknown probe(s): {', '.join(unknown)}" if unknown else "--n must be 1 or more")
    for tree in trees:
        if not os.path.isdir(os.path.join(tree, "queickd")):
            p.error(f"{tree} holds no queickd/ package")
    for tree in trees:  # bytecode caches first: a compile counted in one run and not the other skews it
        for probe in probes:
            _run(tree, probe, 10, False)
    print(f"instructions per unit (callgrind), N = {a.n} and {3 * a.n}")
    header = f"{'probe':<14}{'unit':<8}" + "".join(f"{os.path.basename(os.path.abspath(t)) or t:>16}" for t in trees)
    print(header + ("    ratio to the first" if len(trees) > 1 else ""))
    for probe in probes:
        counts = []
        for tree in trees:
            print(f"  counting {probe} on {tree} ...", file=sys.stderr, flush=True)
            counts.append(per_unit(tree, probe, a.n))
        ratios = "    " + "  ".join(f"{c / counts[0]:.3f}" for c in counts[1:]) if len(trees) > 1 else ""
        print(f"{probe:<14}{PROBES[probe][1]:<8}" + "".join(f"{c:>16,.0f}" for c in counts) + ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
