"""Regressions from review: one bad job, request or callback must never stop the queue."""

import json
import os
import socket
import subprocess
import sys
import threading

import pytest
from helpers import DaemonProcess
from store_contract import T0, job

from queickd.core.cron import Every, parse_schedule
from queickd.core.job import Outcome, State
from queickd.core.policy.claim import Request
from queickd.services.batcher import SubmitBatcher
from queickd.services.netcheck import NetworkMonitor
from queickd.store import open_store
from queickd.store.sqlite.store import SQLiteStore


def test_a_job_whose_error_is_not_valid_unicode_is_recorded_and_the_pool_goes_on(start_daemon):
    d = start_daemon(None, workers=1)
    with d.client() as q:
        bad = q.wait(q.enqueue("testjobs:fail_surrogate"), 20)
        assert bad["state"] == State.DEAD and "caf\\udce9" in bad["error"]["message"]
        assert q.wait(q.enqueue("testjobs:add", args=(1, 2)), 20)["result"] == 3


def test_an_exception_that_cannot_be_printed_still_ends_its_job(start_daemon):
    d = start_daemon(None, workers=1)
    with d.client() as q:
        job = q.wait(q.enqueue("testjobs:fail_unprintable"), 20)
        assert job["state"] == State.DEAD and "unprintable" in job["error"]["message"]
        assert q.wait(q.enqueue("testjobs:add", args=(2, 2)), 20)["result"] == 4


def test_a_request_with_a_lone_surrogate_is_refused_and_its_neighbours_are_stored(daemon):
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=20) as s:
        lines = [b'{"op":"enqueue","func":"testjobs:noop"}',
                 b'{"op":"enqueue","func":"testjobs:noop","args":["\\ud800"]}',
                 b'{"op":"enqueue","func":"testjobs:noop","retry":{"max_attempts":100000000000000000000}}',
                 b'{"op":"enqueue","func":"testjobs:noop"}']
        s.sendall(b"\n".join(lines) + b"\n")
        f = s.makefile("rb")
        replies = [json.loads(f.readline()) for _ in lines]
    assert [r["ok"] for r in replies] == [True, False, False, True]
    assert {r["error"]["code"] for r in replies if not r["ok"]} == {"bad_request"}


def test_a_second_daemon_on_the_same_store_refuses_to_start(start_daemon, db_url, gate, tmp_path):
    first = start_daemon(db_url, workers=1)
    with first.client() as q:
        held = q.enqueue("testjobs:gate", args=(gate.port, "once"))
        assert gate.arrival() == "once"
        r = subprocess.run([sys.executable, "-m", "queickd", "run", "--store", db_url, "--port", "0",
                            "--app-dir", str(tmp_path)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 78 and "already served by a daemon" in r.stderr
        assert q.get(held)["state"] == State.RUNNING and q.get(held)["orphaned"] == 0
        gate.release_all()
        assert q.wait(held, 20)["attempts"] == 1


def test_the_store_lock_dies_with_a_killed_daemon(db_url):
    d = DaemonProcess(db_url).start()
    d.kill()
    again = DaemonProcess(db_url).start()  # kill -9 leaves no stale lock behind
    again.close()


def test_the_committer_survives_an_error_after_a_commit():
    calls = []

    def flaky(jobs, subs):
        calls.append(len(subs))
        if len(calls) == 1:
            raise RuntimeError("a hook failed")

    b = SubmitBatcher(open_store("memory://"), flaky)
    b.start()
    answers = []
    for _ in range(2):
        got = threading.Event()
        b.submit([[job()]], lambda a, got=got: (answers.append(a), got.set()))
        assert got.wait(10)
    b.stop()
    assert len(answers) == 2 and all(not isinstance(a, BaseException) for a in answers)


def test_a_failing_network_callback_does_not_stop_the_supervision():
    seen = []

    def on_change(up):
        seen.append(up)
        if len(seen) == 1:
            raise RuntimeError("store trouble")

    m = NetworkMonitor("127.0.0.1:9", 1.0, on_change)
    m._report(False)
    m._report(True)
    assert seen == [False, True] and m.up is True


def test_intervals_too_small_to_advance_are_refused():
    with pytest.raises(ValueError):
        parse_schedule({"every": 1e-300, "start_at": 1.8e9})
    assert Every(1e-300, 1.8e9).next_after(1.8e9 + 0.5) > 1.8e9 + 0.5  # and never loop forever


def test_cron_ticks_keep_moving_forward_through_the_repeated_dst_hour():
    code = (
        "import time; from queickd.core.cron import CronExpr\n"
        "e = CronExpr.parse('* * * * *')\n"
        "t = 1761440400.0 + 30  # 2025-10-26 02:00:30 CET, the second 02:00 in Berlin\n"
        "for _ in range(120):\n"
        "    n = e.next_after(t); assert n > t, (t, n); assert n - t <= 60, (t, n); t = n\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "TZ": "Europe/Berlin"}, timeout=30)
    assert r.stdout.strip() == "ok", r.stderr


def _ticks_through_the_fall_back_in_berlin(expr: str) -> list[str]:
    """The ticks of expr from 2025-10-26 01:00 CEST to 04:00 CET (the clocks go back at 03:00
    CEST to 02:00 CET), as local times with their zone."""
    code = (
        "import time; from queickd.core.cron import CronExpr\n"
        f"e, t, out = CronExpr.parse({expr!r}), 1761433200.0, []\n"
        "while True:\n"
        "    n = e.next_after(t); assert n > t, (t, n); t = n\n"
        "    if t >= 1761447600.0: break\n"
        "    out.append(time.strftime('%H:%M %Z', time.localtime(t)))\n"
        "print(','.join(out))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "TZ": "Europe/Berlin"}, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(",")


def test_a_cron_of_every_quarter_hour_keeps_its_pace_through_the_repeated_dst_hour():
    ticks = _ticks_through_the_fall_back_in_berlin("*/15 * * * *")
    assert ticks == [f"{h}:{m} {z}" for h, z in (("01", "CEST"), ("02", "CEST"), ("02", "CET"), ("03", "CET"))
                     for m in ("00", "15", "30", "45")][1:]


def test_an_hourly_cron_runs_in_both_passes_of_the_repeated_dst_hour_and_a_daily_one_once():
    assert _ticks_through_the_fall_back_in_berlin("30 * * * *") == [
        "01:30 CEST", "02:30 CEST", "02:30 CET", "03:30 CET"]
    assert _ticks_through_the_fall_back_in_berlin("30 2 * * *") == ["02:30 CEST"]


def test_a_wait_longer_than_the_socket_timeout_still_returns(daemon):
    with daemon.client(timeout=2.0) as q:
        job_id = q.enqueue("testjobs:noop", delay=3)
        assert q.wait(job_id, 15)["state"] == State.SUCCEEDED


def test_enqueue_many_past_one_request_is_refused_not_split(client):
    with pytest.raises(ValueError, match="all or none"):
        client.enqueue_many([client.job("testjobs:noop")] * 10_001)


def test_a_name_imported_into_an_allowed_module_is_not_runnable(tmp_path, start_daemon):
    (tmp_path / "importer.py").write_text("from json import dumps\n\ndef own():\n    return 1\n")
    d = DaemonProcess(f"sqlite:///{tmp_path / 'q.db'}", "--app-dir", str(tmp_path)).start()
    try:
        with d.client() as q:
            job = q.wait(q.enqueue("importer:dumps", args=([1],)), 20)
            assert job["state"] == State.DEAD and job["error"]["type"] == "not_allowed"
            assert q.wait(q.enqueue("importer:own"), 20)["result"] == 1
    finally:
        d.close()


def test_a_bad_environment_value_is_a_usage_error():
    r = subprocess.run([sys.executable, "-m", "queickd", "stats"], capture_output=True, text=True,
                       env={**os.environ, "QUEICKD_PORT": "abc"}, timeout=30)
    assert r.returncode == 2 and "QUEICKD_PORT" in r.stderr


@pytest.mark.parametrize("make", [lambda: open_store("memory://"), lambda: SQLiteStore(":memory:")], ids=["memory", "sqlite"])
def test_a_key_whose_head_job_waits_is_not_overtaken(make):
    store = make()
    for _ in range(2):  # pause m:bad
        store.submit([job(func="m:bad")], T0)
        (j,) = store.claim_available(Request.of(1, now=T0))
        store.finish_if_running([Outcome.dead(j.id, {"type": "E", "message": ""})], T0, pause_after=2)
    store.submit([job(func="m:bad", key="ledger"), job(func="m:good", key="ledger")], T0)
    assert store.claim_available(Request.of(5, now=T0)) == []  # the head of "ledger" is paused, so is the key
    store.submit([job(retry_on_network=True, key="k2"), job(key="k2")], T0)
    assert store.claim_available(Request.of(5, network_up=False, now=T0)) == []
