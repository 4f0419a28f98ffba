"""The operator's everyday commands against a real daemon: cancel (a running job, or in
bulk), pause and drain, cron delete, enqueue --priority, jobs filters, the crons table;
and every flag's help."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from queickd.cli.parser import build_parser
from queickd.core.job import State
from queickd.ui.text import local_time


def queick(port, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "queickd", *args, "--port", str(port)],
                          capture_output=True, text=True, timeout=timeout)


def _parsers(p: argparse.ArgumentParser, path: str = "queick"):
    yield path, p
    for act in p._actions:
        if isinstance(act, argparse._SubParsersAction):
            for name, sp in act.choices.items():
                yield from _parsers(sp, f"{path} {name}")


def test_a_time_the_platform_cannot_show_prints_as_its_number():
    # A store written before such times were refused must not break `jobs` or `crons`.
    assert (local_time(1e20), local_time(None)) == ("100000000000000000000", "-")


# --- help ---------------------------------------------------------------------------------
def test_every_flag_has_a_help_line_and_no_switch_has_a_metavar():
    missing, metavars = [], []
    for path, p in _parsers(build_parser()):
        for act in p._actions:
            if isinstance(act, argparse._SubParsersAction) or not act.option_strings and path.endswith("attendance"):
                continue
            if not act.help or act.help == argparse.SUPPRESS:
                missing.append(f"{path} {'/'.join(act.option_strings) or act.dest}")
            if act.nargs == 0 and act.metavar is not None:
                metavars.append(f"{path} {'/'.join(act.option_strings)}")
    assert missing == [] and metavars == []


def test_run_help_shows_durations_as_the_readme_does_and_switches_take_no_value():
    text = subprocess.run([sys.executable, "-m", "queickd", "run", "--help"], capture_output=True, text=True,
                          timeout=60).stdout
    assert "[ACCEPT_QUEICK_CLIENTS]" not in text and "86400" not in text and "604800" not in text
    flat = " ".join(text.split())
    assert "(default: 24h)" in flat and "(default: 7d)" in flat and "(default: 5m)" in flat


# --- the client library's features on the command line ------------------------------------
def test_enqueue_takes_a_priority(daemon):
    r = queick(daemon.port, "enqueue", "testjobs:noop", "--priority", "7", "--delay", "3600")
    with daemon.client() as q:
        assert q.get(int(r.stdout))["priority"] == 7


def test_jobs_filters_by_function_key_and_pool(daemon):
    with daemon.client() as q:
        a = q.enqueue("testjobs:add", (1, 1), key="k", pool="gpu", delay=3600)
        q.enqueue("testjobs:add", (1, 2), key="k", delay=3600)
        q.enqueue("testjobs:noop", pool="gpu", delay=3600)
    r = queick(daemon.port, "jobs", "--func", "testjobs:add", "--key", "k", "--pool", "gpu", "--json")
    import json

    assert [j["id"] for j in json.loads(r.stdout)] == [a]


def test_cron_delete_stops_a_cron_and_crons_prints_a_table(daemon):
    with daemon.client() as q:
        q.cron("*/5 * * * *", "testjobs:noop", name="tick")
        q.cron("0 3 * * *", "testjobs:add", (1, 2), name="nightly")
    table = queick(daemon.port, "crons").stdout.splitlines()
    assert table[0].split() == ["NAME", "SCHEDULE", "FUNC", "POOL", "NEXT", "LAST", "FOLDED"]
    assert [line.split()[0] for line in table[1:]] == ["nightly", "tick"] and "0 3 * * *" in table[1]
    assert "{" not in "\n".join(table)
    r = queick(daemon.port, "cron", "delete", "tick")
    assert r.returncode == 0 and "deleted cron tick" in r.stdout
    with daemon.client() as q:
        assert [c["name"] for c in q.crons()] == ["nightly"]
    gone = queick(daemon.port, "cron", "delete", "tick")
    assert gone.returncode == 1 and "no cron named 'tick'" in gone.stderr


# --- pause by hand and drain ----------------------------------------------------------------
def test_pause_by_hand_holds_a_key_with_no_probe_until_resumed(daemon):
    r = queick(daemon.port, "pause", "ledger")
    assert r.returncode == 0 and "paused ledger until 'queick resume'" in r.stdout
    with daemon.client() as q:
        held = q.enqueue("testjobs:add", (1, 1), key="ledger")
        other = q.wait(q.enqueue("testjobs:noop"), 20)
        assert other["state"] == State.SUCCEEDED and q.get(held)["state"] == State.QUEUED
        (p,) = q.stats()["paused"]
        assert (p["kind"], p["name"], p["probe_at"], p["trips"]) == ("key", "ledger", None, 0)
        assert "until resumed" in queick(daemon.port, "jobs").stdout
        assert queick(daemon.port, "resume", "ledger").returncode == 0
        assert q.wait(held, 20)["result"] == 2


def test_pause_of_a_pool_holds_its_jobs_only(start_daemon):
    d = start_daemon(None, "--pool", "default", "--pool", "gpu")
    assert queick(d.port, "pause", "--pool", "gpu").returncode == 0
    with d.client() as q:
        held = q.enqueue("testjobs:noop", pool="gpu")
        assert q.wait(q.enqueue("testjobs:noop"), 20)["state"] == State.SUCCEEDED
        assert q.get(held)["state"] == State.QUEUED
        assert queick(d.port, "resume", "--pool", "gpu").returncode == 0
        assert q.wait(held, 20)["state"] == State.SUCCEEDED


def test_drain_lets_running_jobs_finish_starts_nothing_new_and_reports_idle(daemon, gate):
    with daemon.client() as q:
        running = q.enqueue("testjobs:gate", (gate.port, "held"))
        assert gate.arrival() == "held"
        drain = subprocess.Popen([sys.executable, "-m", "queickd", "drain", "--timeout", "60", "--port",
                                  str(daemon.port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        daemon.wait_for_line("operator began a drain")
        later = q.enqueue("testjobs:noop")  # accepted as usual, not started
        assert q.stats()["draining"] is True
        assert "DRAINING" in queick(daemon.port, "status").stdout
        gate.release_all()
        out, err = drain.communicate(timeout=60)
        assert drain.returncode == 0 and out.startswith("idle") and "waiting for 1 running job" in err
        assert q.get(running)["state"] == State.SUCCEEDED and q.get(later)["state"] == State.QUEUED
        assert queick(daemon.port, "drain", "--off").returncode == 0
        assert q.wait(later, 20)["state"] == State.SUCCEEDED


def test_drain_that_times_out_says_still_busy_and_exits_1(daemon, gate):
    with daemon.client() as q:
        q.enqueue("testjobs:gate", (gate.port, "held"))
        assert gate.arrival() == "held"
        r = queick(daemon.port, "drain", "--timeout", "0.5")
        assert r.returncode == 1 and "still busy" in r.stdout and "1 job(s) running" in r.stdout


def test_drain_with_no_wait_on_an_idle_daemon_reports_idle_at_once(daemon):
    r = queick(daemon.port, "drain", "--timeout", "0")
    assert r.returncode == 0 and r.stdout.startswith("idle")


def test_a_negative_drain_timeout_is_a_usage_error(daemon):
    r = queick(daemon.port, "drain", "--timeout", "-5")
    assert r.returncode == 2 and "'-5' is negative" in r.stderr


# --- cancel ---------------------------------------------------------------------------------
def test_cancel_of_a_running_job_marks_it_cancelled_and_discards_its_outcome(daemon, gate):
    with daemon.client() as q:
        job = q.enqueue("testjobs:gate", (gate.port, "held"), key="door")
        assert gate.arrival() == "held"
        r = queick(daemon.port, "cancel", str(job))
        assert r.returncode == 0 and q.get(job)["state"] == State.CANCELLED
        daemon.wait_for_line(f"operator cancelled job {job}")
        nxt = q.wait(q.enqueue("testjobs:add", (2, 3), key="door"), 20)  # its key is free at once
        assert nxt["result"] == 5
        gate.release_all()  # the thread's call returns; its outcome is discarded
        after = q.wait(q.enqueue("testjobs:noop"), 20)
        assert after["state"] == State.SUCCEEDED
        assert q.get(job)["state"] == State.CANCELLED and q.get(job)["result"] is None


def test_bulk_cancel_counts_first_and_cancels_with_yes(daemon):
    with daemon.client() as q:
        mine = [q.enqueue("testjobs:add", (i, i), key="k", delay=3600) for i in range(3)]
        other = q.enqueue("testjobs:noop", delay=3600)
    dry = queick(daemon.port, "cancel", "--state", "scheduled", "--func", "testjobs:add")
    assert dry.returncode == 0 and "3 job(s) would be cancelled" in dry.stdout and "--yes" in dry.stdout
    with daemon.client() as q:
        assert {q.get(i)["state"] for i in mine} == {State.SCHEDULED}
    r = queick(daemon.port, "cancel", "--state", "scheduled", "--func", "testjobs:add", "--key", "k", "--yes")
    assert r.returncode == 0 and "3 job(s) cancelled" in r.stdout
    with daemon.client() as q:
        assert {q.get(i)["state"] for i in mine} == {State.CANCELLED}
        assert q.get(other)["state"] == State.SCHEDULED


@pytest.mark.parametrize("args", [["cancel"], ["cancel", "5", "--yes"], ["pause"], ["pause", "k", "--func", "m:f"]])
def test_cancel_and_pause_refuse_an_ambiguous_target(daemon, args):
    assert queick(daemon.port, *args).returncode == 2
