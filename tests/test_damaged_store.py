"""A damaged SQLite store is noticed at start: the daemon exits 78 saying what it found and how
to recover, never a traceback, never an empty queue in place of a used one; `queick db check`
finds the same, and `queick db recover` copies every readable job into a new file that a
daemon then serves. Real files, real daemons."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import JOBS_DIR, DaemonProcess

JOBS = 1000


def queick(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "queickd", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def start(path: Path) -> subprocess.CompletedProcess:
    """A daemon started on the file; it is expected to refuse it and exit at once."""
    return queick("run", "--store", f"sqlite:///{path}", "--port", "0", "--app-dir", str(JOBS_DIR))


@pytest.fixture
def used(tmp_path) -> tuple[Path, dict[int, list]]:
    """A store a daemon has used and stopped cleanly: JOBS queued jobs, {id: args}."""
    path = tmp_path / "queue.db"
    d = DaemonProcess(f"sqlite:///{path}", workers=0).start()
    with d.client() as q:
        ids = q.enqueue_many([{"func": "testjobs:noop", "args": [i, "x" * 100]} for i in range(JOBS)])
    assert d.terminate() == 0
    return path, {job_id: [i, "x" * 100] for i, job_id in enumerate(ids)}


@pytest.fixture
def killed(tmp_path) -> tuple[Path, dict[int, list]]:
    """A store whose daemon was killed with -9 after JOBS acknowledged jobs, {id: args}: their
    commits are still only in the -wal, not yet checkpointed into the file."""
    path = tmp_path / "queue.db"
    d = DaemonProcess(f"sqlite:///{path}", workers=0).start()
    with d.client() as q:
        ids = q.enqueue_many([{"func": "testjobs:noop", "args": [i, "x" * 100]} for i in range(JOBS)])
    d.kill()
    assert Path(f"{path}-wal").stat().st_size > 100 * path.stat().st_size
    return path, {job_id: [i, "x" * 100] for i, job_id in enumerate(ids)}


def page_aligned_middle(path: Path) -> int:
    size = path.stat().st_size
    return size // 2 - (size // 2) % 4096


def garbage_mid_file(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(page_aligned_middle(path))
        f.write(os.urandom(4096))


def garbage_header(path: Path) -> None:
    with open(path, "r+b") as f:
        f.write(os.urandom(100))


def truncate_half(path: Path) -> None:
    os.truncate(path, page_aligned_middle(path))


def assert_refused(r: subprocess.CompletedProcess, found: str) -> None:
    assert r.returncode == 78, r.stderr
    assert "Traceback" not in r.stderr
    assert "is damaged" in r.stderr and found in r.stderr, r.stderr
    assert "queick db recover" in r.stderr


@pytest.fixture(params=["sqlite3 command", "salvage"])
def way(request, tmp_path) -> dict:
    """The environment of `queick db recover`: as found (the sqlite3 command's .recover where it
    works), or without the command on PATH (the salvage: SQLite's reads, then the pages)."""
    return {} if request.param == "sqlite3 command" else {"PATH": str(tmp_path / "empty")}


def recovered_jobs(tmp_path: Path, damaged: Path, env: dict | None = None) -> dict[int, list]:
    """`queick db recover` into a new file, then a daemon on it: {id: args} it serves."""
    new = tmp_path / "recovered.db"
    r = queick("db", "recover", "--store", f"sqlite:///{damaged}", "--to", str(new), env=env)
    assert r.returncode == 0, r.stderr
    d = DaemonProcess(f"sqlite:///{new}", workers=0).start()
    with d.client() as q:
        jobs = {j["id"]: j["args"] for j in q.jobs(limit=10 * JOBS)}
        assert q.stats()["counts"]["queued"] == len(jobs)  # counts made again from the rows
    d.terminate()
    return jobs


# --- the daemon refuses to start ----------------------------------------------------------------


def test_a_used_store_emptied_to_0_bytes_stops_the_daemon_with_exit_78(used):
    path, _ = used
    os.truncate(path, 0)
    assert_refused(start(path), "the file is empty (0 bytes)")
    assert path.stat().st_size == 0  # not made into a new, empty store


def test_a_used_store_whose_file_is_gone_stops_the_daemon_with_exit_78(used):
    path, _ = used
    path.unlink()
    assert_refused(start(path), "it is missing")
    assert not path.exists()


def test_a_used_store_replaced_by_an_empty_database_stops_the_daemon_with_exit_78(used):
    import sqlite3

    path, _ = used
    path.unlink()
    sqlite3.connect(path).execute("CREATE TABLE other (x)").connection.close()
    assert_refused(start(path), "holds no queickd schema")


def test_4kb_of_garbage_mid_file_stops_the_daemon_with_exit_78(used):
    path, _ = used
    garbage_mid_file(path)
    assert_refused(start(path), "quick_check found")


def test_header_garbage_stops_the_daemon_with_exit_78(used):
    path, _ = used
    garbage_header(path)
    assert_refused(start(path), "not an SQLite header")


def test_a_half_truncated_file_stops_the_daemon_with_exit_78(used):
    path, _ = used
    truncate_half(path)
    assert_refused(start(path), "it is truncated")


def test_a_wal_without_its_database_stops_the_daemon_with_exit_78(tmp_path):
    path = tmp_path / "queue.db"
    Path(f"{path}-wal").write_bytes(os.urandom(8192))
    assert_refused(start(path), "-wal or -shm is there")


def test_a_new_store_gets_a_marker_that_remembers_it(tmp_path):
    path = tmp_path / "queue.db"
    d = DaemonProcess(f"sqlite:///{path}", workers=0).start()
    assert Path(f"{path}.id").read_text().startswith("queickd SQLite store queue.db, created ")
    assert d.terminate() == 0


def test_db_migrate_on_a_damaged_store_exits_78_without_a_traceback(used):
    path, _ = used
    garbage_header(path)
    r = queick("db", "migrate", "--store", f"sqlite:///{path}")
    assert r.returncode == 78 and "is damaged" in r.stderr and "Traceback" not in r.stderr


# --- queick db check --------------------------------------------------------------------------


def test_db_check_says_ok_with_the_counts_for_a_sound_store(used):
    path, _ = used
    r = queick("db", "check", "--store", f"sqlite:///{path}")
    assert r.returncode == 0 and "ok" in r.stdout and f"{JOBS} queued" in r.stdout


def test_db_check_exits_1_naming_what_it_found(used):
    path, _ = used
    truncate_half(path)
    r = queick("db", "check", "--store", f"sqlite:///{path}")
    assert r.returncode == 1 and "it is truncated" in r.stderr and "queick db recover" in r.stderr


# --- queick db recover ------------------------------------------------------------------------


def test_recover_after_garbage_mid_file_brings_back_the_readable_jobs(tmp_path, used, way):
    path, jobs = used
    garbage_mid_file(path)
    back = recovered_jobs(tmp_path, path, way)
    assert JOBS - 100 <= len(back) <= JOBS  # at most the rows of 4 KB of pages are lost
    assert all(jobs[i] == args for i, args in back.items())


def test_recover_after_header_garbage_brings_back_every_job(tmp_path, used, way):
    path, jobs = used
    garbage_header(path)
    assert recovered_jobs(tmp_path, path, way) == jobs


def test_recover_of_a_half_truncated_file_brings_back_the_jobs_in_the_half_that_is_left(tmp_path, used, way):
    path, jobs = used
    truncate_half(path)
    back = recovered_jobs(tmp_path, path, way)
    assert 0 < len(back) < JOBS
    assert all(jobs[i] == args for i, args in back.items())


def test_recover_of_a_0_byte_file_makes_an_empty_store_and_says_nothing_was_readable(tmp_path, used):
    path, _ = used
    os.truncate(path, 0)
    r = queick("db", "recover", "--store", f"sqlite:///{path}", "--to", str(tmp_path / "new.db"))
    assert r.returncode == 0 and "recovered 0 jobs" in r.stdout and "could not read" in r.stderr


def next_id_after_recover(tmp_path, path) -> int:
    """The id a daemon on the file `queick db recover` made from `path` gives a new job."""
    new = tmp_path / "recovered.db"
    assert queick("db", "recover", "--store", f"sqlite:///{path}", "--to", str(new)).returncode == 0
    d = DaemonProcess(f"sqlite:///{new}", workers=0).start()
    with d.client() as q:
        job_id = q.enqueue("testjobs:noop")
    d.terminate()
    return job_id


def test_recover_leaves_the_damaged_file_as_it_was(tmp_path, used):
    path, _ = used
    garbage_mid_file(path)
    before = path.read_bytes()
    recovered_jobs(tmp_path, path)
    assert path.read_bytes() == before


def test_recovered_store_gives_new_jobs_ids_after_every_id_the_damaged_one_knew(tmp_path, used):
    path, jobs = used
    truncate_half(path)
    assert next_id_after_recover(tmp_path, path) == max(jobs) + 1


def test_recover_without_the_sqlite3_command_uses_the_row_by_row_salvage(tmp_path, used):
    path, _ = used
    garbage_header(path)
    r = queick("db", "recover", "--store", f"sqlite:///{path}", "--to", str(tmp_path / "new.db"),
               env={"PATH": str(tmp_path / "empty")})
    assert r.returncode == 0 and f"recovered {JOBS} jobs" in r.stdout and "row-by-row salvage" in r.stdout


def test_recover_refuses_while_a_daemon_serves_the_store(tmp_path):
    path = tmp_path / "queue.db"
    d = DaemonProcess(f"sqlite:///{path}", workers=0).start()
    r = queick("db", "recover", "--store", f"sqlite:///{path}", "--to", str(tmp_path / "new.db"))
    assert r.returncode == 1 and "served by a running daemon" in r.stderr
    assert not (tmp_path / "new.db").exists()
    d.terminate()


def test_recover_after_a_kill_9_and_header_garbage_brings_back_the_jobs_only_in_the_wal(tmp_path, killed, way):
    path, jobs = killed
    garbage_header(path)
    assert recovered_jobs(tmp_path, path, way) == jobs


def test_recover_after_a_kill_9_and_header_garbage_gives_new_jobs_ids_after_those_in_the_wal(tmp_path, killed):
    path, jobs = killed
    garbage_header(path)
    assert next_id_after_recover(tmp_path, path) == max(jobs) + 1


def test_recover_that_cannot_read_the_wal_says_so_naming_it_and_its_size(tmp_path, killed):
    path, _ = killed
    garbage_header(path)
    wal = Path(f"{path}-wal")
    garbage_header(wal)  # not a WAL's header: SQLite cannot read any of its commits
    r = queick("db", "recover", "--store", f"sqlite:///{path}", "--to", str(tmp_path / "new.db"))
    assert r.returncode == 0, r.stderr
    assert f"could not read the commits in {wal} ({wal.stat().st_size} bytes)" in r.stderr


def test_a_recovered_store_gets_the_pages_of_a_new_store(tmp_path, used, way):
    import sqlite3

    path, _ = used
    garbage_mid_file(path)
    new = tmp_path / "new.db"
    r = queick("db", "recover", "--store", f"sqlite:///{path}", "--to", str(new), env=way)
    assert r.returncode == 0, r.stderr
    with sqlite3.connect(new) as c:
        assert c.execute("PRAGMA page_size").fetchone()[0] == 1024


# What comes back after each damage: every job, some of them, all but a few pages' worth.
BACK_AFTER = {garbage_header: lambda n: n == JOBS, truncate_half: lambda n: 0 < n < JOBS,
              garbage_mid_file: lambda n: JOBS - 100 <= n <= JOBS}


@pytest.mark.parametrize("damage", list(BACK_AFTER), ids=lambda f: f.__name__)
def test_recover_reads_a_store_of_4_kib_pages_as_earlier_releases_made_them(tmp_path, way, damage):
    import sqlite3

    path = tmp_path / "queue.db"
    with sqlite3.connect(path) as c:
        c.execute("PRAGMA page_size=4096")
        c.execute("PRAGMA journal_mode=WAL")
    d = DaemonProcess(f"sqlite:///{path}", workers=0).start()
    with d.client() as q:
        ids = q.enqueue_many([{"func": "testjobs:noop", "args": [i, "x" * 100]} for i in range(JOBS)])
    assert d.terminate() == 0
    jobs = {job_id: [i, "x" * 100] for i, job_id in enumerate(ids)}
    damage(path)
    back = recovered_jobs(tmp_path, path, way)
    assert BACK_AFTER[damage](len(back)), len(back)
    assert all(jobs[i] == args for i, args in back.items())
