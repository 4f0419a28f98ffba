"""The `queick db ...` sub-parsers: maintenance of a store, run by this process on the store
itself (cli/run.py), never through a daemon. Only parses."""

from __future__ import annotations

from typing import Any

from ..settings import SQLITE_PAGE, SQLITE_PAGE_SIZES
from .options import DEFAULTS, opt


def add_db_parsers(sub: Any, local: Any) -> None:
    """`db` and its actions on the sub-parsers `sub`; `local(name)` is the handler of each."""
    db = sub.add_parser("db", help="database maintenance", description="Database maintenance.")
    dbsub = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    mig = dbsub.add_parser("migrate", help="create or upgrade the store's schema (idempotent)",
                           description="Create or upgrade the schema of the store (the daemon does this "
                           "at start too). Safe to run again, and from several hosts at once.")
    opt(mig, "--store", "store URL", DEFAULTS.store)
    mig.set_defaults(handler=local("db_migrate"))
    bak = dbsub.add_parser("backup", help="copy the SQLite store to PATH, safely, while the daemon runs",
                           description="Copy the SQLite store to a new file PATH online (SQLite's backup "
                           "API, one read snapshot): the copy holds every job acknowledged before it "
                           "began. Progress goes to stderr for a large store. Not for PostgreSQL (pg_dump).")
    bak.add_argument("path", help="the new file to write (it must not exist)")
    opt(bak, "--store", "store URL", DEFAULTS.store)
    bak.set_defaults(handler=local("db_backup"))
    clr = dbsub.add_parser("clear-budgets", help="remove the cost budgets in force from a PostgreSQL store",
                           description="Remove every cost budget in force from the PostgreSQL database: "
                           "every daemon and worker on it follows at once. One whose --config names "
                           "[budgets] writes its own again when it next starts, so remove them there too. "
                           "On SQLite the daemon's config file holds the budgets: edit it and restart.")
    opt(clr, "--store", "store URL", DEFAULTS.store)
    clr.set_defaults(handler=local("db_clear_budgets"))
    chk = dbsub.add_parser("check", help="check the SQLite store as the daemon does at start",
                           description="Check the SQLite store without writing to it: the file against "
                           "its marker (PATH.id), its header, PRAGMA quick_check and its schema. Exits 0 "
                           "if it is sound, 1 if it is damaged (the daemon would refuse it, exit 78).")
    opt(chk, "--store", "store URL", DEFAULTS.store)
    chk.set_defaults(handler=local("db_check"))
    rec = dbsub.add_parser("recover", help="copy every readable job of a damaged SQLite store into a new file",
                           description="Copy every row that can still be read from a damaged SQLite store "
                           "into the new file TO (sqlite3's .recover where it works, else a row-by-row "
                           "salvage, then a read of the pages no readable index leads to). The damaged "
                           "file is never written. Stop the daemon first.")
    opt(rec, "--store", "the damaged store's URL", DEFAULTS.store)
    rec.add_argument("--to", required=True, metavar="PATH", help="the new file to write (it must not exist)")
    rec.set_defaults(handler=local("db_recover"))
    vac = dbsub.add_parser("vacuum", help="rewrite a stopped SQLite store compact, with a new store's page size",
                           description="Rewrite the SQLite store in place: its free pages dropped and its "
                           f"pages made {SQLITE_PAGE} bytes, as a new store's (a store made by an earlier "
                           "release keeps 4096-byte pages, and writes about three times the bytes a job: "
                           "what wears an SD card). A crash midway leaves the store as it was. The daemon "
                           "must be stopped; the disk needs room for twice the store meanwhile.")
    opt(vac, "--store", "store URL", DEFAULTS.store)
    vac.add_argument("--page-size", type=int, default=SQLITE_PAGE, choices=SQLITE_PAGE_SIZES, metavar="BYTES",
                     help=f"the page size to rewrite it with (default: {SQLITE_PAGE}; a power of two, 512-65536)")
    vac.set_defaults(handler=local("db_vacuum"))
