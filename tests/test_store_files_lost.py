"""A store file deleted or replaced under a running daemon (an operator's `rm queue.db-wal`,
a backup moved over the database): the daemon notices at its next commit (or its next look
between commits), saves what the deleted WAL holds, says so loudly and refuses writes
instead of acknowledging jobs into a file no one will read. Real daemons on a real SQLite
file; SIGKILL for the crash."""

from __future__ import annotations

import os
import shutil

import pytest
from httphelpers import scrape, start_web

from queickd.core.protocol import QueueError


def _enqueue_until_refused(q, most: int = 50) -> tuple[list[int], QueueError | None]:
    """(the jobs acknowledged, the refusal that ended them; None if `most` were acknowledged)."""
    acked = []
    for _ in range(most):
        try:
            acked.append(q.enqueue("testjobs:noop", delay=3600))
        except QueueError as e:
            return acked, e
    return acked, None


def test_enqueues_after_the_wal_is_deleted_are_refused_with_a_clear_error(start_daemon, tmp_path):
    d = start_daemon(None)
    with d.client() as q:
        q.enqueue("testjobs:noop", delay=3600)
        os.unlink(tmp_path / "queue.db-wal")
        _, refused = _enqueue_until_refused(q)
        assert refused is not None and refused.code == "internal"
        assert "queue.db-wal was deleted under the running daemon" in refused.message
        assert "queue.db-wal was deleted" in q.stats()["store_problem"]
    d.wait_for_line(r"CRITICAL .*STORE FILE LOST: .*queue\.db-wal was deleted .*nothing is lost")


def test_every_acknowledged_job_survives_a_deleted_wal_and_kill_9(start_daemon, tmp_path):
    d = start_daemon(None)
    with d.client() as q:
        acked = [q.enqueue("testjobs:noop", delay=3600) for _ in range(100)]
        os.unlink(tmp_path / "queue.db-wal")
        more, _ = _enqueue_until_refused(q)
    d.kill()
    again = start_daemon(None)
    with again.client() as q:
        kept = {j["id"] for j in q.jobs(state="scheduled", limit=10_000)}
        assert set(acked + more) <= kept
        q.enqueue("testjobs:noop")  # a restart writes again, to a WAL of its own


def test_a_wal_deleted_while_the_daemon_is_idle_is_saved_before_a_kill_9(start_daemon, tmp_path):
    d = start_daemon(None)
    with d.client() as q:
        acked = [q.enqueue("testjobs:noop", delay=3600) for _ in range(100)]
    os.unlink(tmp_path / "queue.db-wal")  # and nothing written after it
    # Noticed and saved; or, had the daemon's idle look come first, copied before it went.
    d.wait_for_line(r"STORE FILE LOST: .*queue\.db-wal was deleted .*nothing is lost|the WAL is all in")
    d.kill()
    again = start_daemon(None)
    with again.client() as q:
        assert set(acked) <= {j["id"] for j in q.jobs(state="scheduled", limit=10_000)}


def test_a_database_file_replaced_under_the_daemon_stops_writes(start_daemon, tmp_path):
    d = start_daemon(None)
    db = tmp_path / "queue.db"
    with d.client() as q:
        q.enqueue("testjobs:noop", delay=3600)
        shutil.copy(db, tmp_path / "copy.db")
        os.replace(tmp_path / "copy.db", db)  # another file (inode) under the same name
        _, refused = _enqueue_until_refused(q)
    assert refused is not None and refused.code == "internal" and "queue.db was replaced by another file" in refused.message
    d.wait_for_line(r"STORE FILE LOST: .*queue\.db was replaced .*put the database file back")


def test_health_and_metrics_show_a_deleted_wal(start_daemon, tmp_path):
    web = start_web(start_daemon, tmp_path)
    assert web.get("/healthz").status == 200
    assert scrape(web)[("queickd_store_writable", ())] == 1
    with web.daemon.client() as q:
        q.enqueue("testjobs:noop", delay=3600)
        os.unlink(tmp_path / "queue.db-wal")
        _enqueue_until_refused(q)
    r = web.get("/healthz")
    assert r.status == 503 and b"queue.db-wal was deleted" in r.body
    assert scrape(web)[("queickd_store_writable", ())] == 0


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_writes_go_on_while_the_files_stay_put(start_daemon, durability):
    d = start_daemon(None, "--durability", durability)
    with d.client() as q:
        ids = [q.enqueue("testjobs:noop") for _ in range(200)]
        assert q.wait(ids[-1], 30)["state"] == "succeeded"
        assert q.stats()["store_problem"] is None
    assert not [line for line in d.lines if "STORE FILE LOST" in line]
