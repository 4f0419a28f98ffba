"""Rows read straight from an SQLite file's pages (store/sqlite/pages.py): what a salvage falls
back on when SQLite's own walk of a table no longer reaches its leaves. Real files written by
SQLite, damaged the way disks and power cuts damage them."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from queickd.store.sqlite import pages as sqlite_pages

ROWS = 600
SCHEMA = ("CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, state TEXT, args TEXT, n INTEGER,"
          " x REAL, b BLOB, a1, a2, a3, a4, a5, a6, a7, a8);"
          "CREATE TABLE small (name TEXT, v INTEGER);"
          "CREATE INDEX jobs_state ON jobs (state);")


def expected(i: int) -> dict:
    """The row written for i: every kind of value, some larger than a page."""
    args = "y" * 5000 if i % 50 == 0 else f"args {i}"
    return {"id": i, "state": "queued", "args": args, "n": i * 1_000_003 - 7, "x": i / 3,
            "b": bytes([i % 256]) * 3, "a1": None, "a2": 0, "a3": 1, "a4": -i, "a5": 2**40 + i,
            "a6": 2**62, "a7": "é", "a8": 1.5}


def write(path: Path, page: int, rows: int = ROWS, wal: bool = False) -> sqlite3.Connection:
    """A file of `rows` jobs and one small row; in WAL mode the connection is left open with
    automatic checkpoints off, so its commits are only in the -wal."""
    c = sqlite3.connect(path, isolation_level=None)
    c.execute(f"PRAGMA page_size={page}")
    if wal:
        c.execute("PRAGMA journal_mode=WAL")
        c.execute("PRAGMA wal_autocheckpoint=0")
    c.executescript(SCHEMA)
    c.execute("BEGIN")
    for i in range(1, rows + 1):
        r = {**expected(i), "args": f"args {i}"}
        c.execute(f"INSERT INTO jobs VALUES ({', '.join('?' * len(r))})", list(r.values()))
    for i in range(1, rows + 1):  # the large ones' overflow pages come after every leaf
        if len(expected(i)["args"]) > 1000:
            c.execute("UPDATE jobs SET args = ? WHERE id = ?", (expected(i)["args"], i))
    c.execute("INSERT INTO small VALUES ('one', 1)")
    c.execute("COMMIT")
    return c


def read(path: Path, wal: Path | None = None) -> sqlite_pages.Found:
    with sqlite_pages.Image.open(str(path), str(wal) if wal else None) as image:
        return sqlite_pages.read_rows(image, image.schema())


def jobs(found: sqlite_pages.Found) -> dict[int, dict]:
    return {rowid: row for rowid, row in found.rows.get("jobs", [])}


@pytest.mark.parametrize("page", [512, 1024, 4096, 65536])
def test_every_row_of_a_sound_file_is_read_as_sqlite_reads_it(tmp_path, page):
    path = tmp_path / "q.db"
    write(path, page).close()
    found = read(path)
    assert jobs(found) == {i: expected(i) for i in range(1, ROWS + 1)}
    assert found.rows["small"] == [(1, {"name": "one", "v": 1})]
    assert (found.broken, found.unplaced) == (0, 0)


def test_the_sequence_of_ids_is_read_with_the_rows(tmp_path):
    path = tmp_path / "q.db"
    write(path, 1024).close()
    assert [row for _, row in read(path).rows["sqlite_sequence"]] == [{"name": "jobs", "seq": ROWS}]


def test_rows_under_lost_interior_pages_are_still_read_and_given_to_their_table(tmp_path):
    path = tmp_path / "q.db"
    write(path, 1024).close()
    with sqlite3.connect(path) as c:
        root = c.execute("SELECT rootpage FROM sqlite_master WHERE name = 'jobs'").fetchone()[0]
    with open(path, "r+b") as f:  # the table's root, an interior page, zeroed
        f.seek((root - 1) * 1024)
        f.write(bytes(1024))
    with sqlite3.connect(path) as c, pytest.raises(sqlite3.DatabaseError):
        c.execute("SELECT sum(n) FROM jobs").fetchone()
    assert jobs(read(path)) == {i: expected(i) for i in range(1, ROWS + 1)}


def test_a_half_truncated_file_gives_the_rows_left_and_counts_those_whose_overflow_is_lost(tmp_path):
    path = tmp_path / "q.db"
    write(path, 1024).close()
    os.truncate(path, path.stat().st_size // 2)
    found = read(path)
    back = jobs(found)
    assert 0 < len(back) < ROWS
    assert all(row == expected(i) for i, row in back.items())
    assert found.broken > 0  # rows of 5,000 bytes whose overflow pages were in the lost half


def test_rows_on_free_pages_are_not_brought_back(tmp_path):
    path = tmp_path / "q.db"
    c = write(path, 1024)
    c.execute("PRAGMA secure_delete=OFF")  # as many builds have it: freed pages keep their rows
    c.execute("DELETE FROM jobs WHERE id > 100")
    c.close()
    with sqlite3.connect(path) as check:
        assert check.execute("PRAGMA freelist_count").fetchone()[0] > 0
    assert sorted(jobs(read(path))) == list(range(1, 101))


def test_committed_frames_in_the_wal_are_read_over_the_file(tmp_path):
    path = tmp_path / "q.db"
    live = write(path, 1024, wal=True)
    copy = tmp_path / "copy.db"
    shutil.copy(path, copy)
    shutil.copy(f"{path}-wal", f"{copy}-wal")
    live.close()
    assert copy.stat().st_size < 4 * 1024  # every row is only in the -wal
    assert jobs(read(copy, Path(f"{copy}-wal"))) == {i: expected(i) for i in range(1, ROWS + 1)}


def test_a_torn_last_transaction_in_the_wal_is_left_out(tmp_path):
    path = tmp_path / "q.db"
    live = write(path, 1024, wal=True)
    committed = Path(f"{path}-wal").stat().st_size
    live.execute("INSERT INTO jobs (id, state) VALUES (10000, 'queued')")
    copy = tmp_path / "copy.db"
    shutil.copy(path, copy)
    shutil.copy(f"{path}-wal", f"{copy}-wal")
    live.close()
    with open(f"{copy}-wal", "r+b") as f:  # the last commit's frames, torn mid-write
        f.seek(committed + 100)
        f.write(os.urandom(200))
    back = jobs(read(copy, Path(f"{copy}-wal")))
    assert 10000 not in back and len(back) == ROWS


def test_a_record_that_does_not_add_up_to_its_size_is_refused():
    good = bytes([3, 1, 0x11, 7, ord("a"), ord("b")])  # header 3 bytes: int8, text of 2
    assert sqlite_pages.decode_record(good) == [7, "ab"]
    assert sqlite_pages.decode_record(good + b"!") is None
    assert sqlite_pages.decode_record(good[:-1]) is None


def test_a_row_with_as_many_columns_as_two_tables_have_is_given_to_neither(tmp_path):
    path = tmp_path / "q.db"
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA page_size=1024")
    c.execute("CREATE TABLE a (x, y)")
    c.execute("CREATE TABLE b (x, y)")
    c.executemany("INSERT INTO a VALUES (?, ?)", [(i, "v" * 50) for i in range(200)])
    root = c.execute("SELECT rootpage FROM sqlite_master WHERE name = 'a'").fetchone()[0]
    c.close()
    with open(path, "r+b") as f:  # a's root lost: its leaves could be a's or b's
        f.seek((root - 1) * 1024)
        f.write(bytes(1024))
    found = read(path)
    assert "a" not in found.rows and found.unplaced == 200


@pytest.mark.parametrize("seed", range(12))
def test_pages_overwritten_with_garbage_never_stop_the_read_nor_change_a_row(tmp_path, seed):
    import random

    rnd = random.Random(seed)
    path = tmp_path / "q.db"
    write(path, 1024).close()
    pages = path.stat().st_size // 1024
    with open(path, "r+b") as f:
        for n in rnd.sample(range(1, pages), 8):  # any page but the first (the schema's root)
            f.seek(n * 1024)
            f.write(rnd.randbytes(1024))
    back = jobs(read(path))
    assert all(row == expected(i) for i, row in back.items())
    assert len(back) >= ROWS - 100  # a leaf holds at most a dozen of these rows
