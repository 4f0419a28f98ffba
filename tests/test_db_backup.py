"""`queick db backup PATH`: an online copy of a live daemon's SQLite store."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import DaemonProcess


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


# --- a full disk, a killed backup, two backups at once ---------------------------------------


@pytest.fixture(scope="module")
def large_store(tmp_path_factory) -> Path:
    """A 40 MB store a daemon wrote and stopped: a backup of it takes ten progress steps."""
    db = tmp_path_factory.mktemp("large") / "queue.db"
    d = DaemonProcess(f"sqlite:///{db}", workers=0).start()
    with d.client() as q:
        for _ in range(50):
            q.enqueue_many([{"func": "testjobs:noop", "args": ["x" * 8000]} for _ in range(100)])
    assert d.terminate() == 0
    return db


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill (it needs root): {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def backup_in_background(target: Path, store: Path) -> subprocess.Popen:
    """A backup that has reported its first step: its partial copy is begun, not finished."""
    p = subprocess.Popen([sys.executable, "-m", "queickd", "db", "backup", str(target), "--store",
                          f"sqlite:///{store}"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stdin=subprocess.DEVNULL, text=True)
    assert "%" in p.stderr.readline()
    return p


def test_a_backup_that_fills_the_disk_leaves_no_file_behind(large_store, small_disk):
    r = queick("db", "backup", str(small_disk / "copy.db"), "--store", f"sqlite:///{large_store}")
    assert r.returncode == 1 and "full" in r.stderr
    assert sorted(p.name for p in small_disk.iterdir()) == []


def test_a_backup_killed_with_kill_9_is_replaced_by_the_next_one_with_a_note(large_store, tmp_path):
    target = tmp_path / "copy.db"
    p = backup_in_background(target, large_store)
    p.kill()
    p.wait()
    assert not target.exists() and Path(f"{target}.partial").exists()  # killed mid-copy
    r = queick("db", "backup", str(target), "--store", f"sqlite:///{large_store}")
    assert r.returncode == 0, r.stderr
    assert f"replaced {target}.partial, left by a backup that did not finish" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.db"]
    copy = sqlite3.connect(target)
    try:
        assert copy.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert copy.execute("SELECT count(*) FROM jobs").fetchone()[0] == 5000
    finally:
        copy.close()


def test_a_second_backup_to_a_path_one_is_writing_is_refused_and_the_first_completes(large_store, tmp_path):
    target = tmp_path / "copy.db"
    first = backup_in_background(target, large_store)
    first.send_signal(signal.SIGSTOP)  # holds its partial copy while the second one tries
    try:
        assert not target.exists()  # stopped mid-copy
        r = queick("db", "backup", str(target), "--store", f"sqlite:///{large_store}")
    finally:
        first.send_signal(signal.SIGCONT)
    assert r.returncode == 1 and "being written by another backup" in r.stderr
    first.stderr.read()
    assert first.wait(60) == 0
    copy = sqlite3.connect(target)
    try:
        assert copy.execute("SELECT count(*) FROM jobs").fetchone()[0] == 5000
    finally:
        copy.close()
