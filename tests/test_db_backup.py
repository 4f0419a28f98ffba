"""`queick db backup PATH`: an online copy of a live daemon's SQLite store."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading

import pytest


def queick(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "queickd", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_a_backup_of_a_live_store_holds_every_job_acked_before_it_began(start_daemon, tmp_path):
    db = tmp_path / "queue.db"
    d = start_daemon(f"sqlite:///{db}")
    with d.client() as q:
        acked = q.enqueue_many([{"func": "testjobs:add", "args": [i, 1], "delay": 3600} for i in range(5000)])
    stop, during = threading.Event(), []

    def keep_enqueuing() -> None:  # the daemon keeps taking jobs while the copy is made
        with d.client() as q2:
            while not stop.is_set():
                during.append(q2.enqueue("testjobs:add", [0, 0], delay=3600))

    writer = threading.Thread(target=keep_enqueuing)
    writer.start()
    try:
        r = queick("db", "backup", str(tmp_path / "copy.db"), "--store", f"sqlite:///{db}")
    finally:
        stop.set()
        writer.join(30)
    assert r.returncode == 0, r.stderr
    assert during, "no job was enqueued while the backup ran"
    copy = sqlite3.connect(tmp_path / "copy.db")
    try:
        assert copy.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        ids = {row[0] for row in copy.execute("SELECT id FROM jobs")}
    finally:
        copy.close()
    assert set(acked) <= ids


def test_a_backup_refuses_to_overwrite_a_file(start_daemon, tmp_path):
    d = start_daemon(f"sqlite:///{tmp_path / 'queue.db'}")
    (tmp_path / "copy.db").write_text("keep me")
    r = queick("db", "backup", str(tmp_path / "copy.db"), "--store", d.store_url)
    assert r.returncode == 1 and "exists" in r.stderr and (tmp_path / "copy.db").read_text() == "keep me"


@pytest.mark.parametrize("store", ["memory://", "postgresql://localhost/queickd"])
def test_a_backup_is_only_for_an_sqlite_store(store, tmp_path):
    r = queick("db", "backup", str(tmp_path / "copy.db"), "--store", store)
    assert r.returncode == 2 and "only an SQLite store" in r.stderr and not (tmp_path / "copy.db").exists()


def test_a_backup_of_a_missing_store_creates_nothing(tmp_path):
    r = queick("db", "backup", str(tmp_path / "copy.db"), "--store", f"sqlite:///{tmp_path / 'none.db'}")
    assert r.returncode == 1 and "no SQLite store" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
