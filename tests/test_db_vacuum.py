"""`queick db vacuum`: a stopped SQLite store rewritten in place with a new store's page size,
every job kept; refused while a daemon serves it, for a damaged file, and for no store. Real
files, real daemons, the real command."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import DaemonProcess

JOBS = 300


def queick(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "queickd", *args], capture_output=True, text=True, timeout=60)


def page_size(path: Path) -> int:
    with sqlite3.connect(path) as c:
        return c.execute("PRAGMA page_size").fetchone()[0]


def file_of_an_earlier_release(tmp_path: Path) -> Path:
    """An empty database file as earlier releases made a store's: 4 KiB pages, WAL mode."""
    path = tmp_path / "queue.db"
    with sqlite3.connect(path) as c:
        c.execute("PRAGMA page_size=4096")
        c.execute("PRAGMA journal_mode=WAL")
    return path


@pytest.fixture
def old(tmp_path) -> tuple[Path, dict[int, list]]:
    """A store with 4 KiB pages, as an earlier release made it, that a daemon used and stopped
    cleanly: JOBS queued jobs, {id: args}."""
    path = file_of_an_earlier_release(tmp_path)
    d = DaemonProcess(f"sqlite:///{path}", workers=0).start()
    with d.client() as q:
        ids = q.enqueue_many([{"func": "testjobs:noop", "args": [i, "x" * 200]} for i in range(JOBS)])
    assert d.terminate() == 0
    assert page_size(path) == 4096
    return path, {job_id: [i, "x" * 200] for i, job_id in enumerate(ids)}


def served_jobs(path: Path) -> tuple[dict[int, list], int]:
    """({id: args} a daemon on the file serves, the id it gives a new job)."""
    d = DaemonProcess(f"sqlite:///{path}", workers=0).start()
    with d.client() as q:
        jobs = {j["id"]: j["args"] for j in q.jobs(limit=10 * JOBS)}
        assert q.stats()["counts"]["queued"] == len(jobs)
        new_id = q.enqueue("testjobs:noop")
    assert d.terminate() == 0
    return jobs, new_id


def test_vacuum_gives_an_old_store_the_page_size_of_a_new_one_and_keeps_every_job(old):
    path, jobs = old
    r = queick("db", "vacuum", "--store", f"sqlite:///{path}")
    assert r.returncode == 0, r.stderr
    assert f"{JOBS} jobs, pages of 4096 -> 1024 bytes" in r.stdout
    assert page_size(path) == 1024
    back, new_id = served_jobs(path)
    assert back == jobs and new_id == max(jobs) + 1


def test_vacuum_after_a_kill_9_keeps_the_jobs_only_in_the_wal(tmp_path):
    path = file_of_an_earlier_release(tmp_path)
    d = DaemonProcess(f"sqlite:///{path}", workers=0).start()
    with d.client() as q:
        ids = q.enqueue_many([{"func": "testjobs:noop", "args": [i]} for i in range(JOBS)])
    d.kill()
    assert Path(f"{path}-wal").stat().st_size > path.stat().st_size  # not yet in the file
    assert queick("db", "vacuum", "--store", f"sqlite:///{path}").returncode == 0
    assert served_jobs(path)[0] == {job_id: [i] for i, job_id in enumerate(ids)}


def test_a_vacuumed_store_is_left_in_wal_mode(old):
    path, _ = old
    assert queick("db", "vacuum", "--store", f"sqlite:///{path}").returncode == 0
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_vacuum_takes_the_page_size_asked_for(old):
    path, jobs = old
    assert queick("db", "vacuum", "--store", f"sqlite:///{path}", "--page-size", "2048").returncode == 0
    assert page_size(path) == 2048 and served_jobs(path)[0] == jobs


def test_vacuum_refuses_a_page_size_sqlite_cannot_have(old):
    path, _ = old
    r = queick("db", "vacuum", "--store", f"sqlite:///{path}", "--page-size", "3000")
    assert r.returncode == 2 and "--page-size" in r.stderr
    assert page_size(path) == 4096


def test_vacuum_refuses_while_a_daemon_serves_the_store(old):
    path, _ = old
    d = DaemonProcess(f"sqlite:///{path}", workers=0).start()
    r = queick("db", "vacuum", "--store", f"sqlite:///{path}")
    assert r.returncode == 1 and "served by a running daemon" in r.stderr
    assert d.terminate() == 0
    assert page_size(path) == 4096


def test_vacuum_refuses_a_damaged_store_and_leaves_it_as_it_was(old):
    path, _ = old
    with open(path, "r+b") as f:
        f.write(os.urandom(100))
    before = path.read_bytes()
    r = queick("db", "vacuum", "--store", f"sqlite:///{path}")
    assert r.returncode == 78 and "queick db recover" in r.stderr and "Traceback" not in r.stderr
    assert path.read_bytes() == before


def test_vacuum_of_no_store_says_there_is_none(tmp_path):
    r = queick("db", "vacuum", "--store", f"sqlite:///{tmp_path / 'none.db'}")
    assert r.returncode == 1 and "no SQLite store at" in r.stderr
    assert not (tmp_path / "none.db").exists()


def test_vacuum_is_only_for_sqlite():
    r = queick("db", "vacuum", "--store", "memory://")
    assert r.returncode == 2 and "only an SQLite store" in r.stderr


def test_db_check_names_an_old_stores_page_size_and_the_vacuum(old):
    path, _ = old
    r = queick("db", "check", "--store", f"sqlite:///{path}")
    assert r.returncode == 0 and "pages of 4096 bytes" in r.stdout and "queick db vacuum" in r.stdout
    assert queick("db", "vacuum", "--store", f"sqlite:///{path}").returncode == 0
    r = queick("db", "check", "--store", f"sqlite:///{path}")
    assert "pages of 1024 bytes" in r.stdout and "queick db vacuum" not in r.stdout


def test_a_daemon_on_an_old_store_says_at_start_that_a_vacuum_would_help(old):
    path, _ = old
    d = DaemonProcess(f"sqlite:///{path}", workers=0).start()
    d.wait_for_line("has pages of 4096 bytes .* 'queick db vacuum'")
    assert d.terminate() == 0


SHIM_SOURCE = Path(__file__).resolve().parent.parent / "bench" / "slowfsync.c"


def wait_for(done, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def killed_midway(path: Path, tmp_path: Path, syncs: int) -> None:
    """`queick db vacuum` on `path` killed once `syncs` fsyncs are done, each held 2 s by the
    shim (skips without a C compiler to build it)."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build the fsync shim that holds the vacuum midway")
    lib, count = tmp_path / "slowfsync.so", tmp_path / "fsyncs"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(SHIM_SOURCE), "-ldl"], check=True)
    env = {**os.environ, "LD_PRELOAD": str(lib), "SLOW_FSYNC_MS": "2000", "SLOW_FSYNC_COUNT": str(count)}
    p = subprocess.Popen([sys.executable, "-m", "queickd", "db", "vacuum", "--store", f"sqlite:///{path}"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: count.exists() and count.stat().st_size >= syncs)  # each sync then holds it 2 s
    finally:
        p.kill()
        p.wait()
    assert Path(f"{path}-journal").stat().st_size > 0  # cut short: the journal is hot


@pytest.mark.parametrize("syncs", [1, 3])
def test_a_vacuum_killed_midway_leaves_the_store_as_it_was(old, tmp_path, syncs):
    """Killed once its journal is on disk (1 sync) or while it rewrites the file (3): the
    next open puts the store back, `db check` says so without writing, a daemon serves
    every job."""
    path, jobs = old
    killed_midway(path, tmp_path, syncs)
    r = queick("db", "check", "--store", f"sqlite:///{path}")
    assert r.returncode == 0 and f"{JOBS} queued" in r.stdout and "cut short" in r.stdout, r.stderr
    assert served_jobs(path)[0] == jobs


def test_db_recover_of_a_store_whose_vacuum_was_killed_puts_it_back_first(old, tmp_path):
    path, jobs = old
    killed_midway(path, tmp_path, 3)
    with open(path, "r+b") as f:  # the first page half rewritten (see the test above)
        f.write(os.urandom(100))
    new = tmp_path / "recovered.db"
    r = queick("db", "recover", "--store", f"sqlite:///{path}", "--to", str(new))
    assert r.returncode == 0 and f"recovered {JOBS} jobs" in r.stdout and "could not" not in r.stderr, r.stderr
    assert served_jobs(new)[0] == jobs


def test_a_daemon_starts_on_a_store_whose_cut_short_write_had_begun_on_its_header(old, tmp_path):
    """Once the journal is whole on disk (its third sync here) the file may be rewritten, the
    first page first; a header half rewritten then is SQLite's to put back from the
    journal, not damage to refuse."""
    path, jobs = old
    killed_midway(path, tmp_path, 3)
    with open(path, "r+b") as f:
        f.write(os.urandom(100))
    assert served_jobs(path)[0] == jobs
