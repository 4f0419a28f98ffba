"""The garbage collector's settings for server processes (queickd/collector.py). Each test
runs in a fresh interpreter or a real daemon: the settings are process-wide, and pytest's
own must not change."""

from __future__ import annotations

import subprocess
import sys

from queickd.collector import YOUNG_THRESHOLD


def _run_queick(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "queickd", *args], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _python(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_server_process_collects_its_young_generation_less_often():
    out = _python("import gc; from queickd import collector; collector.tune_for_server(); "
                  "print(gc.get_threshold()[0], gc.isenabled())")
    assert out == f"{YOUNG_THRESHOLD} True"


def test_what_exists_once_set_up_is_frozen_out_of_later_collections():
    out = _python("import gc, queickd.daemon; from queickd import collector; before = gc.get_freeze_count(); "
                  "collector.tune_for_server(); print(before, gc.get_freeze_count())")
    before, after = map(int, out.split())
    assert before == 0 and after > 10_000  # the daemon's modules, at least


def test_reference_cycles_are_still_freed_without_an_explicit_collect():
    # A cycle dropped after the tuning is freed once enough new containers have been made,
    # as a busy daemon makes them: no gc.collect() call anywhere after setting up.
    out = _python(
        "import weakref\n"
        "from queickd import collector\n"
        "collector.tune_for_server()\n"
        "class Node: pass\n"
        "freed = []\n"
        "a, b = Node(), Node(); a.other, b.other = b, a\n"
        "weakref.finalize(a, freed.append, True)\n"
        "del a, b\n"
        "kept = [[i] for i in range(3 * collector.YOUNG_THRESHOLD)]\n"
        "print(freed == [True])\n")
    assert out == "True"



def test_a_running_daemon_shows_its_collector_set_for_a_server_in_its_stats(client):
    gc = client.stats()["collector"]
    assert gc["thresholds"][0] == YOUNG_THRESHOLD and gc["frozen"] > 10_000
    assert len(gc["collections"]) == 3


def test_queick_stats_prints_the_collector(daemon):
    out = _run_queick("stats", "--port", str(daemon.port))
    assert f"collector: young generation every {YOUNG_THRESHOLD} allocations" in out
