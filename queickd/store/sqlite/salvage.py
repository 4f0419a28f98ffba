"""`queick db check` and `queick db recover`: what is wrong with an SQLite store, and a new
file holding every job that can still be read from a damaged one.

Recovery reads a copy of the damaged file (and its -wal): the damaged file is never
written, so nothing is lost by trying. It uses the `sqlite3` command's `.recover` where that
works (it reads every page, so it finds rows no intact index leads to); otherwise, or if
its result fails integrity_check, a salvage with the standard library: every row SQLite
can still read copied into a new file with queickd's schema, row by row past damaged pages,
then every row left on a table page that no readable interior page leads to (pages.py). A
header that is not SQLite's is rebuilt on the copy first: in WAL mode where a -wal holds
commits (after a kill -9 they are often only there), else in rollback mode without them,
and the report says so. The counts by state are made again, and ids continue after the
highest one the damaged file knew. The new file appears whole or not at all.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import tempfile
from dataclasses import dataclass, field

from ...settings import SQLITE_PAGE
from . import check as sqlite_check
from . import pages as sqlite_pages
from . import schema as sqlite_schema
from .flush import fsync_path

_PROBE_BEYOND = 10_000  # rowids probed past the last readable one when the table's end is unknown
_SKIP_META = {"schema_version"}  # the new file's own schema decides its version


@dataclass
class Recovered:
    """What `recover` wrote: rows per table, jobs per state, and how."""

    method: str
    rows: dict[str, int] = field(default_factory=dict)
    states: dict[str, int] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)  # tables that could not be read at all
    notes: list[str] = field(default_factory=list)  # what a user should know about what was read

    @property
    def jobs(self) -> int:
        return sum(self.states.values())


def check(path: str) -> tuple[bool, str]:
    """(sound, what was found): the checks a daemon makes at start, without writing. Where a
    write was cut short (a hot -journal), on a copy that SQLite puts back from it, as the
    daemon's start will put back the store itself."""
    if sqlite_check.hot_journal(path) and os.path.exists(path):
        with tempfile.TemporaryDirectory(prefix="queickd-check-") as tmp:
            copy = os.path.join(tmp, os.path.basename(path))
            _copy_to_read(path, copy)
            if os.path.exists(sqlite_check.marker_path(path)):
                shutil.copyfile(sqlite_check.marker_path(path), sqlite_check.marker_path(copy))
            sound, found = _check(copy)
        found = found.replace(copy, path)
        return sound, found + (f"; {path}-journal holds a write that was cut short: the daemon's start "
                               "(or any open for writing) puts the store back as it was, as checked here")
    return _check(path)


def _check(path: str) -> tuple[bool, str]:
    try:
        if sqlite_check.check_file(path):
            return False, f"no SQLite store at {path}"
        c = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
        try:
            sqlite_check.check_open(c, path)
            version = sqlite_schema.version(c)
            counts = dict(c.execute("SELECT state, n FROM state_counts WHERE n > 0 ORDER BY state"))
            page = c.execute("PRAGMA page_size").fetchone()[0]
        finally:
            c.close()
    except sqlite_check.DamagedStoreError as e:
        return False, f"{path}: {e.found}"
    except sqlite3.Error as e:
        return False, f"{path}: SQLite cannot read it: {e}"
    shown = ", ".join(f"{n} {s}" for s, n in counts.items()) or "no jobs"
    pages = f"pages of {page} bytes" + ("" if page == SQLITE_PAGE else f", a new store's are {SQLITE_PAGE}: "
                                        "'queick db vacuum' rewrites it to write fewer bytes a job")
    return True, f"{path}: ok (quick_check passed, schema version {version}; {shown}; {pages})"


def recover(source: str, target: str) -> Recovered:
    """Copy every readable job of the SQLite file `source` into the new file `target`.
    Raises FileNotFoundError without a source, FileExistsError if target exists."""
    if not os.path.exists(source):
        raise FileNotFoundError(f"no file at {source}")
    if os.path.exists(target):
        raise FileExistsError(f"{target} exists; give a new path")
    partial = f"{target}.partial"
    with tempfile.TemporaryDirectory(prefix="queickd-recover-") as tmp:
        copy = os.path.join(tmp, "damaged.db")
        _copy_to_read(source, copy)
        _remove(partial)
        report = _with_command(copy, partial)
        if report is None:
            _remove(partial)
            report = _salvage(copy, partial, source + "-wal")
    try:
        _finish(partial, report)
    except BaseException:
        _remove(partial)
        raise
    os.replace(partial, target)
    return report


def _copy_to_read(source: str, copy: str) -> None:
    """A copy of the store to read without writing the store: the file, its -wal (the last
    commits may be only there) and, where a write was cut short, its hot -journal, which
    SQLite then plays back into the copy (its first read of a file opened for writing
    does); a copy it cannot open is left as it is, for the salvage."""
    shutil.copyfile(source, copy)
    if os.path.exists(source + "-wal"):
        shutil.copyfile(source + "-wal", copy + "-wal")
    if not sqlite_check.hot_journal(source):
        return
    shutil.copyfile(source + "-journal", copy + "-journal")
    with contextlib.suppress(sqlite3.Error):
        w = sqlite3.connect(copy, isolation_level=None)
        try:
            w.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            w.close()


def _remove(path: str) -> None:
    for p in (path, f"{path}-wal", f"{path}-shm", f"{path}-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


def _with_command(copy: str, partial: str) -> Recovered | None:
    """`sqlite3 copy .recover | sqlite3 partial`, or None where the command is missing or
    fails (some builds lack what .recover needs and stop with 'SQL logic error')."""
    exe = shutil.which("sqlite3")
    if exe is None:
        return None
    try:
        dump = subprocess.run([exe, copy, ".recover"], capture_output=True, timeout=3600)
        if dump.returncode != 0 or b"sql error" in dump.stderr.lower():
            return None
        page = f"PRAGMA page_size={SQLITE_PAGE};\n".encode()  # as a new store's
        load = subprocess.run([exe, partial], input=page + dump.stdout, capture_output=True, timeout=3600)
        if load.returncode != 0:
            return None
        c = sqlite3.connect(partial)
        try:
            if c.execute("PRAGMA integrity_check").fetchone()[0] != "ok" or not _tables(c):
                return None
            rows = {t: c.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in _tables(c)}
        finally:
            c.close()
    except (OSError, subprocess.SubprocessError, sqlite3.Error):
        return None
    return Recovered("sqlite3 .recover", rows)


def _tables(c: sqlite3.Connection) -> list[str]:
    return [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'"
                                    " AND name NOT LIKE 'sqlite_%' ORDER BY name")]


def _open_damaged(copy: str, source_wal: str, report: Recovered) -> sqlite3.Connection:
    """A connection that reads as much of the copy as SQLite will: writable_schema lets a
    file shorter than its header says be opened. A header that is not SQLite's is
    rewritten (on the copy): in WAL mode with the -wal's page size where the -wal holds
    commits, else with the first page size under which the schema reads (without the -wal,
    which is then reported as unread under the name `source_wal`)."""
    with open(copy, "rb") as f:
        head = f.read(100)
    if not head:
        raise sqlite3.DatabaseError("the file is empty (0 bytes)")
    if head.startswith(sqlite_check.HEADER):
        return _connect(copy)
    wal = copy + "-wal"
    wal_size = os.path.getsize(wal) if os.path.exists(wal) else 0
    if wal_size > sqlite_pages.WAL_HEADER:
        with open(wal, "rb") as f:
            page = sqlite_pages.wal_page_size(f.read(sqlite_pages.WAL_HEADER))
        if page is not None:
            _write_header(copy, page, wal=True)
            # Read-only: a failed try cannot checkpoint the -wal into the copy or delete it.
            if (c := _readable(_connect(copy, readonly=True))) is not None:
                return c
        report.unreadable.append(
            f"the commits in {source_wal} ({wal_size} bytes): the jobs written only there since "
            "the last checkpoint are not in the new file")
    for page in sqlite_pages.PROBED:
        _write_header(copy, page)
        if (c := _readable(_connect(copy))) is not None:
            return c
    with open(copy, "r+b") as f:
        f.write(head)
    return _connect(copy)


def _readable(c: sqlite3.Connection) -> sqlite3.Connection | None:
    """`c` if the schema reads on it, else None (`c` closed)."""
    try:
        _tables(c)
        return c
    except sqlite3.DatabaseError:
        c.close()
        return None


def _connect(copy: str, readonly: bool = False) -> sqlite3.Connection:
    uri = f"file:{copy}?mode=ro" if readonly else f"file:{copy}"
    c = sqlite3.connect(uri, uri=True, isolation_level=None)
    c.execute("PRAGMA writable_schema = ON")  # read past a size the header gets wrong
    return c


def _write_header(path: str, page: int, wal: bool = False) -> None:
    """A plausible 100-byte header: the page size, the file's size in pages, UTF-8, format 4;
    WAL mode (the copy's -wal then read with it) or rollback journal (the -wal removed)."""
    size = os.path.getsize(path)
    mode = 2 if wal else 1
    h = bytearray(100)
    h[0:16] = sqlite_check.HEADER
    h[16:18] = (1 if page == 65536 else page).to_bytes(2, "big")
    h[18], h[19], h[20], h[21], h[22], h[23] = mode, mode, 0, 64, 32, 32
    h[24:28] = (1).to_bytes(4, "big")  # change counter
    h[28:32] = (size // page).to_bytes(4, "big")
    h[40:44] = (1).to_bytes(4, "big")  # schema cookie
    h[44:48] = (4).to_bytes(4, "big")  # schema format
    h[56:60] = (1).to_bytes(4, "big")  # UTF-8
    h[92:96] = (1).to_bytes(4, "big")  # version-valid-for: the change counter
    h[96:100] = (3040000).to_bytes(4, "big")
    if not wal:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + "-wal")
    with open(path, "r+b") as f:
        f.write(h)


def _salvage(copy: str, partial: str, source_wal: str) -> Recovered:
    """Every row SQLite still reads, then every row left on a table page it does not reach.
    The pages are read as the copy was before a header was written over it."""
    report = Recovered("row-by-row salvage (Python's sqlite3)")
    dst = sqlite3.connect(partial, isolation_level=None)
    try:
        dst.execute(f"PRAGMA page_size={SQLITE_PAGE}")  # as a new store's
        sqlite_schema.migrate(dst, partial)
        with sqlite_pages.Image.open(copy, copy + "-wal") as image:
            dst.execute("BEGIN")
            _salvage_rows(copy, source_wal, dst, report)
            _salvage_pages(image, dst, report)
            dst.execute("COMMIT")
    finally:
        dst.close()
    return report


def _salvage_rows(copy: str, source_wal: str, dst: sqlite3.Connection, report: Recovered) -> None:
    """Every row of each table that SQLite can still read."""
    try:
        src = _open_damaged(copy, source_wal, report)
    except sqlite3.DatabaseError as e:
        report.unreadable.append(f"the whole file: {e}")
        return
    try:
        try:
            tables = _tables(src)
        except sqlite3.DatabaseError as e:
            report.unreadable.append(f"its list of tables ({e})")
            return
        wanted = set(_tables(dst))
        for table in tables:
            if table in wanted:
                report.rows[table] = _copy_table(src, dst, table, report)
        _carry_sequence(src, dst)
    finally:
        src.close()


def _salvage_pages(image: sqlite_pages.Image, dst: sqlite3.Connection, report: Recovered) -> None:
    """The rows on table leaf pages that SQLite did not reach (no readable interior page
    leads to them any more), added where their rowid is not taken. Tables the damaged file's
    schema no longer names are read with this version's columns."""
    tables = image.schema() or {
        t: sqlite_pages.from_connection(dst, t) for t in _tables(dst)
        if dst.execute("SELECT 1 FROM sqlite_master WHERE name = ? AND sql LIKE '%WITHOUT ROWID%'",
                       (t,)).fetchone() is None}
    found = sqlite_pages.read_rows(image, tables)
    sequence = [row.get("seq") or 0 for _, row in found.rows.pop("sqlite_sequence", []) if row.get("name") == "jobs"]
    wanted = set(_tables(dst))
    added = 0
    for table, rows in found.rows.items():
        if table not in wanted:
            continue
        known = set(_columns(dst, table))
        n = 0
        for _, row in rows:
            cols = [c for c in row if c in known]
            names = ", ".join(f'"{c}"' for c in cols)
            insert = f'INSERT OR IGNORE INTO "{table}" ({names}) VALUES ({", ".join("?" * len(cols))})'
            with contextlib.suppress(sqlite3.Error):  # a row that breaks a constraint is left out
                n += dst.execute(insert, [row[c] for c in cols]).rowcount
        report.rows[table] = report.rows.get(table, 0) + n
        added += n if table == "jobs" else 0
    if added:
        report.method += " and a read of its pages"
        report.notes.append(
            f"{added} jobs were read from pages that no index of the damaged file leads to any more; a job "
            "deleted shortly before the damage can be among them: look at them before they run")
    if found.broken:
        report.unreadable.append(f"{found.broken} rows on pages that are torn or whose overflow pages are lost")
    if found.unplaced:
        report.unreadable.append(f"{found.unplaced} rows on pages that could not be told apart by table")
    _raise_sequence(dst, max(sequence, default=0))


def _columns(c: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in c.execute(f'PRAGMA table_info("{table}")')]


def _copy_table(src: sqlite3.Connection, dst: sqlite3.Connection, table: str, report: Recovered) -> int:
    try:
        cols = [c for c in _columns(src, table) if c in set(_columns(dst, table))]
        rowid = src.execute("SELECT 1 FROM sqlite_master WHERE name = ? AND sql LIKE '%WITHOUT ROWID%'",
                            (table,)).fetchone() is None
    except sqlite3.DatabaseError as e:
        report.unreadable.append(f"{table} ({e})")
        return 0
    names = ", ".join(f'"{c}"' for c in cols)
    insert = f'INSERT OR IGNORE INTO "{table}" ({names}) VALUES ({", ".join("?" * len(cols))})'
    rows = _rowid_rows(src, table, names) if rowid else _plain_rows(src, table, names)
    if table == "meta":
        rows = [r for r in rows if r[0] not in _SKIP_META]
    dst.executemany(insert, rows)
    return len(rows)


def _plain_rows(src: sqlite3.Connection, table: str, names: str) -> list[tuple]:
    """Every row until the first unreadable page (tables without rowid are small)."""
    rows: list[tuple] = []
    with contextlib.suppress(sqlite3.DatabaseError):
        for r in src.execute(f'SELECT {names} FROM "{table}"'):
            rows.append(r)
    return rows


def _rowid_rows(src: sqlite3.Connection, table: str, names: str) -> list[tuple]:
    """Every readable row in rowid order: scan until a damaged page stops the scan, then
    look rowids up one at a time until one reads, and scan on from there."""
    rows: list[tuple] = []
    last = -(2**63)
    end = _last_rowid(src, table)
    while True:
        try:
            for r in src.execute(f'SELECT rowid, {names} FROM "{table}" WHERE rowid > ? ORDER BY rowid', (last,)):
                last = r[0]
                rows.append(r[1:])
            return rows
        except sqlite3.DatabaseError:
            pass
        limit = max(end or 0, last + _PROBE_BEYOND) if last > 0 else (end or _PROBE_BEYOND)
        probe, found = max(last, 0) + 1, False
        while probe <= limit and not found:
            try:
                r = src.execute(f'SELECT rowid, {names} FROM "{table}" WHERE rowid = ?', (probe,)).fetchone()
            except sqlite3.DatabaseError:
                r = None
            if r is not None:
                rows.append(r[1:])
                last, found = probe, True
            probe += 1
        if not found:
            return rows


def _last_rowid(src: sqlite3.Connection, table: str) -> int | None:
    """The highest rowid the table had: sqlite_sequence's (AUTOINCREMENT), else max(rowid)."""
    for sql in ("SELECT seq FROM sqlite_sequence WHERE name = ?", f'SELECT max(rowid) FROM "{table}"'):
        try:
            row = src.execute(sql, (table,) if "?" in sql else ()).fetchone()
        except sqlite3.DatabaseError:
            continue
        if row and row[0] is not None:
            return int(row[0])
    return None


def _carry_sequence(src: sqlite3.Connection, dst: sqlite3.Connection) -> None:
    """New jobs continue after the highest id the damaged file (and its -wal) knew, read or
    not: the largest of its sequence, its highest readable id and the highest id copied."""
    seq = 0
    for sql in ("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'", "SELECT max(rowid) FROM jobs"):
        with contextlib.suppress(sqlite3.DatabaseError):
            row = src.execute(sql).fetchone()
            seq = max(seq, row[0] or 0) if row else seq
    _raise_sequence(dst, seq)


def _raise_sequence(dst: sqlite3.Connection, seq: int) -> None:
    """The next job's id comes after `seq` and after every id copied."""
    seq = max(seq, dst.execute("SELECT coalesce(max(id), 0) FROM jobs").fetchone()[0])
    if dst.execute("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'jobs'", (seq,)).rowcount == 0:
        dst.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', ?)", (seq,))


def _finish(partial: str, report: Recovered) -> None:
    """Counts by state made again from the jobs there are; checked; synced to disk."""
    c = sqlite3.connect(partial, isolation_level=None)
    try:
        sqlite_schema.migrate(c, partial)  # a file from .recover of an older queickd
        c.execute("BEGIN IMMEDIATE")
        c.execute("DELETE FROM state_counts")
        c.execute("INSERT INTO state_counts SELECT state, count(*) FROM jobs GROUP BY state")
        c.execute("COMMIT")
        report.states = dict(c.execute("SELECT state, n FROM state_counts"))
        ok = c.execute("PRAGMA integrity_check").fetchone()[0]
        if ok != "ok":
            raise sqlite3.DatabaseError(f"the recovered file failed its integrity check: {ok}")
        c.execute("PRAGMA journal_mode = DELETE")  # one file, nothing left in a WAL
    finally:
        c.close()
    fsync_path(partial)
