"""The probes bench/instructions.py counts under valgrind run to their end natively: each in
a fresh interpreter, as the counter runs them, with a few units."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROBES = ["submit-lone", "submit-batch", "pass", "pool"]


@pytest.mark.parametrize("probe", PROBES)
def test_each_probe_does_its_units_of_work_and_exits_cleanly(probe, tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "instrprobes.py"), probe, "5", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "q.db").exists()


def test_the_probes_listed_here_are_the_counters():
    r = subprocess.run([sys.executable, "-c", "from bench.instrprobes import PROBES; print(' '.join(PROBES))"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.stdout.split() == PROBES


def test_an_unknown_probe_is_refused_before_anything_runs():
    r = subprocess.run([sys.executable, "-m", "bench.instructions", "--only", "nope"], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and ("unknown probe(s): nope" in r.stderr or "valgrind is not installed" in r.stderr)
