"""Running out of file descriptors must not turn into lost work: the connection cap keeps
descriptors for the store and the jobs, a job that meets EMFILE anyway is the host's
failure (retried, never pausing its function), and the refusals do not flood the log.
The daemon runs under a lowered RLIMIT_NOFILE (prlimit)."""

from __future__ import annotations

import random
import shutil
import socket

import pytest

pytestmark = pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
NOFILE = ["prlimit", "--nofile=256:256", "--"]


def test_a_flood_of_idle_connections_leaves_jobs_their_file_descriptors(start_daemon):
    d = start_daemon(None, "--hello-timeout", "60", workers=1, prefix=NOFILE)
    d.wait_for_line("serving at most 128 connections, not 256")
    with d.client() as q:
        q.stats()  # connected before the flood: one of the connections served
        flood: list[socket.socket] = []
        try:
            for _ in range(600):
                flood.append(socket.create_connection(("127.0.0.1", d.port), timeout=10))
            job = q.wait(q.enqueue("testjobs:open_files", args=(64,)), 20)
        finally:
            for s in flood:
                s.close()
    assert (job["state"], job["result"]) == ("succeeded", 64)


def test_refused_connections_are_logged_a_few_times_not_once_each(start_daemon):
    # On a loopback address of its own: a client of another test that connects again to the
    # port its stopped daemon had (now this one's, perhaps) must not take one of the 4 slots
    # and free it mid-flood, which would let a connection past the cap be served.
    host = f"127.0.0.{random.randint(2, 254)}"
    d = start_daemon(None, "--bind", host, "--max-connections", "4", "--hello-timeout", "60", workers=1)
    flood = []
    for _ in range(4):  # served, each proven by a request (idle ones have a smaller share of their own)
        flood.append(socket.create_connection((host, d.port), timeout=10))
        flood[-1].sendall(b'{"op":"stats"}\n')
        assert b'"ok":true' in flood[-1].makefile("rb").readline().replace(b" ", b"")
    flood += [socket.create_connection((host, d.port), timeout=10) for _ in range(56)]  # within the listen backlog
    try:
        for s in flood[4:]:
            assert b"too many connections" in s.makefile("rb").readline()  # told, then closed
    finally:
        for s in flood:
            s.close()
    # Every refusal is logged before its reply is sent, but the log reaches us through a pipe
    # another thread reads: stop the daemon and read up to its last line before counting.
    assert d.terminate() == 0
    d.wait_for_line(r"queickd\.daemon: stopped$")
    refused = [line for line in d.lines if "refused a connection" in line]
    assert 1 <= len(refused) <= 6


def test_a_job_failed_by_the_fd_limit_is_retried_and_never_pauses_its_function(start_daemon):
    d = start_daemon(None, "--pause-after", "2", workers=1)
    with d.client() as q:
        for _ in range(3):
            job = q.wait(q.enqueue("testjobs:raise_emfile"), 20, states=["scheduled", "dead"])
            assert job["state"] == "scheduled"
        assert q.stats()["paused"] == []
