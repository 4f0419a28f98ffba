"""`queick status` and `queick top` against a real daemon with known contents."""

from __future__ import annotations

import fcntl
import json
import os
import select
import struct
import subprocess
import sys
import termios
import time

import pytest


def queick(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "queickd", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def known(start_daemon, gate, tmp_path):
    """One job held running, two waiting on key 'door', one scheduled, a dead letter."""
    d = start_daemon(workers=1)
    with d.client() as q:
        q.wait(q.enqueue("testjobs:fail", ["card reader unplugged"]), 20)
        q.enqueue("testjobs:gate", [gate.port, "held"])
        assert gate.arrival() == "held"
        q.enqueue("testjobs:noop", key="door", run_at=time.time() - 90)
        q.enqueue("testjobs:noop", key="door")
        q.enqueue("testjobs:noop", delay=3600)
    return d


def test_status_prints_the_daemons_picture(known):
    r = queick("status", "--port", str(known.port))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "workers  1 busy / 0 idle   running 1   waiting 3 (queued 2, scheduled 1, for network 0)" in out
    assert "dead     1 jobs, 0 events   scheduler alive" in out
    assert "network  no checker configured" in out
    door = next(line for line in out.splitlines() if line.startswith("door"))
    assert door.split()[:2] == ["door", "2"]
    assert "testjobs:gate" in out  # running
    assert "testjobs:fail: ValueError: card reader unplugged" in out
    oldest = next(line for line in out.splitlines() if line.startswith("oldest"))
    age = oldest.split()[4]  # the job due 90 s ago has waited that long (give or take a slow start)
    assert age.endswith("s") and 90 <= int(age[:-1]) < 120


def test_status_json_is_the_detailed_stats_reply(known):
    r = queick("status", "--json", "--port", str(known.port))
    s = json.loads(r.stdout)
    assert s["counts"]["queued"] == 2
    assert [j["func"] for j in s["running"]] == ["testjobs:gate"]
    assert s["dead_jobs"][0]["error"]["message"] == "card reader unplugged"
    assert len(s["history"]) == 60


def test_status_without_a_daemon_says_so_and_exits_1(tmp_path):
    r = queick("status", "--port", "1")
    assert r.returncode == 1
    assert "cannot reach queickd" in r.stderr


def test_top_draws_the_status_and_quits_on_q(known):
    # queick top on a terminal of its own (a pty of 40 x 120), as a person would run it
    fd, tty = os.openpty()
    fcntl.ioctl(tty, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "queickd", "top", "--port", str(known.port)],
                            stdin=tty, stdout=tty, stderr=tty, env={**os.environ, "TERM": "xterm"},
                            start_new_session=True)
    os.close(tty)
    seen = b""
    deadline = time.monotonic() + 60
    try:
        # the whole first frame: the running job, and the footer drawn after everything else
        while not (b"testjobs:gate" in seen and b"q: quit" in seen) and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if ready:
                seen += os.read(fd, 65536)
        assert b"testjobs:gate" in seen and b"q: quit" in seen, seen[-3000:]
        os.write(fd, b"q")
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(fd)


def test_top_without_a_terminal_says_it_needs_one(known):
    r = queick("top", "--port", str(known.port))
    assert r.returncode == 2 and "needs a terminal" in r.stderr and "Traceback" not in r.stderr


def test_top_refuses_json(known):
    r = queick("top", "--json", "--port", str(known.port))
    assert r.returncode == 2 and "queick status --json" in r.stderr


def test_status_lists_only_live_members_on_sqlite(start_daemon):
    # A SQLite store has one daemon at a time: a restart leaves the earlier daemon's runs in
    # the last hour's counts, but that daemon is no member any more.
    first = start_daemon(workers=1)
    with first.client() as q:
        assert q.wait(q.enqueue("testjobs:add", [1, 2]), 20)["result"] == 3
    assert first.terminate() == 0
    second = start_daemon(workers=1)
    with second.client() as q:
        assert q.wait(q.enqueue("testjobs:add", [3, 4]), 20)["result"] == 7
        hour = q.stats()["last_hour"]
    assert hour["completed"] == 2  # every run of the hour, the earlier daemon's too
    assert [m["member"].rsplit(":", 1)[1] for m in hour["members"]] == [str(second.proc.pid)]
    out = queick("status", "--port", str(second.port)).stdout
    assert "2 in the last hour" in out and f":{first.proc.pid}" not in out
