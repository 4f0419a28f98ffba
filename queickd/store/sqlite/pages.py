"""Rows read straight from an SQLite file's pages, without SQLite: the salvage's last resort
for rows that no readable interior page leads to any more (half a file lost takes a deep
table's interior pages with it, and SQLite's own walk then reaches none of its leaves).

An image is the file's pages with the -wal's committed frames over them (checked by their
salts and checksums, as SQLite reads them). Its table leaf pages are parsed cell by cell
(overflow chains followed); a row is kept only if its record decodes exactly to its stated
size. A leaf belongs to the table whose tree, walked from its root as far as the pages
allow, reaches it; else to the one table with enough columns, or to none. Free pages hold
rows already deleted: skipped. Reads only. File format: https://www.sqlite.org/fileformat2.html
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from ...settings import SQLITE_PAGE, SQLITE_PAGE_SIZES
from . import check as sqlite_check

WAL_HEADER = 32  # bytes; a -wal no longer than this holds no commits
_FRAME_HEADER = 24
_LEAF, _INTERIOR = 0x0D, 0x05  # table b-tree page types
# The sizes to try where the header is lost: those queickd makes (now, before) first.
PROBED = (SQLITE_PAGE, 4096, *(s for s in SQLITE_PAGE_SIZES if s not in (SQLITE_PAGE, 4096)))
_MASTER_COLUMNS = 5  # sqlite_master: type, name, tbl_name, rootpage, sql


@dataclass
class Table:
    """What the image needs of a table: its columns in the file's order, its root page."""

    columns: list[str]
    root: int | None = None
    rowid_alias: int | None = None  # the INTEGER PRIMARY KEY column, stored as NULL in a record


@dataclass
class Found:
    """Rows by table, [(rowid, {column: value})], and how many leaf rows had no table."""

    rows: dict[str, list[tuple[int, dict]]] = field(default_factory=dict)
    unplaced: int = 0
    broken: int = 0  # cells that did not decode (a torn page, a lost overflow page)


def varint(b: bytes, i: int) -> tuple[int, int]:
    """(value, next offset) of the big-endian variable-length integer at b[i]."""
    v = 0
    for k in range(8):
        byte = b[i + k]
        v = (v << 7) | (byte & 0x7F)
        if byte < 0x80:
            return v, i + k + 1
    return (v << 8) | b[i + 8], i + 9


def wal_page_size(head: bytes) -> int | None:
    """The page size a -wal's header records (the database's when it was written), or None
    where `head` is not a WAL's header."""
    if len(head) < WAL_HEADER:
        return None
    magic, _, page = struct.unpack(">III", head[:12])
    return page if magic in (0x377F0682, 0x377F0683) and page in SQLITE_PAGE_SIZES else None


_INT_SIZES = {1: 1, 2: 2, 3: 3, 4: 4, 5: 6, 6: 8}


def decode_record(payload: bytes) -> list | None:
    """The values of a record, or None where its header and body do not add up."""
    try:
        size, i = varint(payload, 0)
        types = []
        while i < size:
            t, i = varint(payload, i)
            types.append(t)
        if i != size:
            return None
        values: list = []
        pos = size
        for t in types:
            if t in _INT_SIZES:
                n = _INT_SIZES[t]
                values.append(int.from_bytes(payload[pos:pos + n], "big", signed=True))
            elif t == 7:
                n = 8
                values.append(struct.unpack(">d", payload[pos:pos + 8])[0])
            elif t in (0, 8, 9):
                n = 0
                values.append(None if t == 0 else t - 8)
            elif t >= 12:
                n = (t - 12) // 2
                raw = payload[pos:pos + n]
                values.append(bytes(raw) if t % 2 == 0 else raw.decode("utf-8"))
            else:
                return None  # 10 and 11 are reserved
            pos += n
        return values if pos == len(payload) else None
    except (IndexError, UnicodeDecodeError, struct.error):
        return None


class Image:
    """The pages of a database file, the -wal's committed frames over them."""

    def __init__(self, path: str, wal: str | None = None, page_size: int | None = None) -> None:
        self._f = open(path, "rb")  # noqa: SIM115 - closed by close()
        self.header = self._f.read(100)
        self.frames: dict[int, bytes] = {}
        wal_size, pages = self._read_wal(wal) if wal and os.path.exists(wal) else (None, 0)
        self.page_size = page_size or wal_size or self._header_page_size()
        reserved = self.header[20] if self._header_sound() else 0
        self.usable = self.page_size - reserved if self.page_size else 0
        # the database's size at the -wal's last commit, else the file's (a cut file's header overstates it)
        self.pages = pages or (os.path.getsize(path) // self.page_size if self.page_size else 0)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> Image:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _header_sound(self) -> bool:
        return self.header.startswith(sqlite_check.HEADER)

    def _header_page_size(self) -> int | None:
        return sqlite_check.page_size(self.header) if self._header_sound() else None

    def _read_wal(self, wal: str) -> tuple[int | None, int]:
        """Load the -wal's committed frames (the newest of each page); (page size, pages in
        the database after the last commit), or (None, 0) where the -wal holds none."""
        with open(wal, "rb") as f:
            data = f.read()
        page = wal_page_size(data)
        if page is None:
            return None, 0
        magic, _, _, _, salt1, salt2 = struct.unpack(">IIIIII", data[:24])
        order = ">" if magic & 1 else "<"
        s = _checksum(data[:24], order, (0, 0))
        if s != struct.unpack(">II", data[24:32]):
            return None, 0
        pending: dict[int, bytes] = {}
        db_pages = 0
        pos = WAL_HEADER
        while pos + _FRAME_HEADER + page <= len(data):
            pgno, commit, fs1, fs2, c1, c2 = struct.unpack(">IIIIII", data[pos:pos + _FRAME_HEADER])
            body = data[pos + _FRAME_HEADER:pos + _FRAME_HEADER + page]
            if (fs1, fs2) != (salt1, salt2):
                break
            s = _checksum(body, order, _checksum(data[pos:pos + 8], order, s))
            if s != (c1, c2):
                break
            pending[pgno] = body
            if commit:
                self.frames.update(pending)
                pending.clear()
                db_pages = commit
            pos += _FRAME_HEADER + page
        return (page if self.frames else None), db_pages

    @classmethod
    def open(cls, path: str, wal: str | None = None) -> Image:
        """The image under the page size the header or the -wal gives, else the first size
        under which a schema reads (the header may be garbage)."""
        image = cls(path, wal)
        if image.page_size:
            return image
        image.close()
        for size in PROBED:
            image = cls(path, wal, size)
            if image.schema():
                return image
            image.close()
        return cls(path, wal)

    def page(self, n: int) -> bytes | None:
        """Page n (from 1), or None where the file and the -wal do not hold all of it. Page
        1's header is the one the file had when the image was opened (a salvage may write
        another over it to get SQLite to read the file)."""
        if n in self.frames:
            return self.frames[n]
        if not self.page_size or n < 1:
            return None
        self._f.seek((n - 1) * self.page_size)
        b = self._f.read(self.page_size)
        if len(b) != self.page_size:
            return None
        return self.header + b[100:] if n == 1 else b

    def free_pages(self) -> set[int]:
        """The pages on the free list, as far as its trunk pages read."""
        first = self.page(1)
        if first is None or not first.startswith(sqlite_check.HEADER):
            return set()
        free: set[int] = set()
        trunk = int.from_bytes(first[32:36], "big")
        while trunk and trunk not in free:
            page = self.page(trunk)
            if page is None:
                break
            free.add(trunk)
            count = int.from_bytes(page[4:8], "big")
            if count > (self.usable - 8) // 4:
                break
            free.update(int.from_bytes(page[8 + 4 * k:12 + 4 * k], "big") for k in range(count))
            trunk = int.from_bytes(page[0:4], "big")
        return free

    def leaf_cells(self, n: int) -> Iterator[tuple[int, list | None]] | None:
        """(rowid, values or None where the cell does not decode) of each cell on the table
        leaf page n, or None where page n is not a sound table leaf."""
        page = self.page(n)
        start = 100 if n == 1 else 0
        if page is None or page[start] != _LEAF:
            return None
        count = int.from_bytes(page[start + 3:start + 5], "big")
        pointers = start + 8
        if pointers + 2 * count > self.usable:
            return None
        offsets = [int.from_bytes(page[pointers + 2 * k:pointers + 2 * k + 2], "big") for k in range(count)]
        if any(not pointers + 2 * count <= o < self.usable for o in offsets):
            return None
        return (self._cell(page, o) for o in offsets)

    def _cell(self, page: bytes, at: int) -> tuple[int, list | None]:
        try:
            size, i = varint(page, at)
            rowid, i = varint(page, i)
        except IndexError:
            return 0, None
        rowid = rowid - (1 << 64) if rowid >= 1 << 63 else rowid
        local = self._local(size)
        payload = bytearray(page[i:i + local])
        if local < size:
            payload += self._overflow(int.from_bytes(page[i + local:i + local + 4], "big"), size - local)
        return rowid, (decode_record(bytes(payload)) if len(payload) == size else None)

    def _local(self, size: int) -> int:
        """The bytes of a payload of `size` kept on a table leaf (the rest overflows)."""
        u = self.usable
        most = u - 35
        if size <= most:
            return size
        least = (u - 12) * 32 // 255 - 23
        k = least + (size - least) % (u - 4)
        return k if k <= most else least

    def _overflow(self, n: int, wanted: int) -> bytes:
        out = bytearray()
        seen: set[int] = set()
        while n and len(out) < wanted and n not in seen:
            seen.add(n)
            page = self.page(n)
            if page is None:
                break
            out += page[4:self.usable][:wanted - len(out)]
            n = int.from_bytes(page[0:4], "big")
        return bytes(out)

    def leaves_under(self, root: int) -> set[int]:
        """The table leaf pages a walk from `root` reaches, past every page it cannot read."""
        leaves: set[int] = set()
        seen: set[int] = set()
        todo = [root]
        while todo:
            n = todo.pop()
            page = self.page(n) if n not in seen else None
            seen.add(n)
            if page is None:
                continue
            start = 100 if n == 1 else 0
            if page[start] == _LEAF:
                leaves.add(n)
            elif page[start] == _INTERIOR:
                count = int.from_bytes(page[start + 3:start + 5], "big")
                todo.append(int.from_bytes(page[start + 8:start + 12], "big"))
                for k in range(count):
                    p = start + 12 + 2 * k
                    o = int.from_bytes(page[p:p + 2], "big")
                    if o + 4 <= len(page):
                        todo.append(int.from_bytes(page[o:o + 4], "big"))
        return leaves

    def schema(self) -> dict[str, Table]:
        """The tables sqlite_master names (WITHOUT ROWID ones left out: their rows are not
        on table pages), each with its columns in the file's order and its root page."""
        tables: dict[str, Table] = {}
        scratch = sqlite3.connect(":memory:")
        try:
            for leaf in sorted(self.leaves_under(1)):
                for _, values in self.leaf_cells(leaf) or ():
                    if not values or len(values) != _MASTER_COLUMNS or values[0] != "table":
                        continue
                    name, root, sql = values[1], values[3], values[4]
                    if not isinstance(name, str) or not isinstance(root, int):
                        continue
                    if name == "sqlite_sequence":  # a name SQLite keeps to itself: not creatable
                        tables[name] = Table(["name", "seq"], root)
                    if not isinstance(sql, str) or "WITHOUT ROWID" in sql.upper() or name.startswith("sqlite_"):
                        continue
                    with contextlib.suppress(sqlite3.Error):
                        scratch.execute(sql)
                        tables[name] = from_connection(scratch, name, root)
        finally:
            scratch.close()
        return tables


def from_connection(c: sqlite3.Connection, name: str, root: int | None = None) -> Table:
    """A table's columns as a connection knows them (its rowid alias found from them)."""
    info = list(c.execute(f'PRAGMA table_info("{name}")'))
    keys = [r for r in info if r[5]]
    alias = keys[0][0] if len(keys) == 1 and keys[0][2].upper() == "INTEGER" else None
    return Table([r[1] for r in info], root, alias)


def read_rows(image: Image, tables: dict[str, Table]) -> Found:
    """Every row on the image's table leaf pages, given to the tables it belongs to."""
    found = Found()
    owner: dict[int, str] = {}
    for name, t in tables.items():
        if t.root:
            owner.update(dict.fromkeys(image.leaves_under(t.root), name))
    skip = image.free_pages() | image.leaves_under(1)
    for n in range(1, image.pages + 1):
        if n in skip:
            continue
        cells = image.leaf_cells(n)
        if cells is None:
            continue
        for rowid, values in cells:
            if values is None:
                found.broken += 1
                continue
            name = owner.get(n)
            if name is None:  # the one table with enough columns, if one (older rows have fewer)
                fits = [k for k, t in tables.items() if len(t.columns) >= len(values)]
                name = fits[0] if len(fits) == 1 else None
            if name is None or len(values) > len(tables[name].columns):
                found.unplaced += 1
                continue
            t = tables[name]
            row = dict(zip(t.columns, values, strict=False))
            if t.rowid_alias is not None:
                row[t.columns[t.rowid_alias]] = rowid
            found.rows.setdefault(name, []).append((rowid, row))
    return found


def _checksum(data: bytes, order: str, s: tuple[int, int]) -> tuple[int, int]:
    """The WAL's running checksum over `data` (a multiple of 8 bytes), from `s`."""
    s0, s1 = s
    words = struct.unpack(f"{order}{len(data) // 4}I", data)
    for k in range(0, len(words), 2):
        s0 = (s0 + words[k] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[k + 1] + s0) & 0xFFFFFFFF
    return s0, s1
