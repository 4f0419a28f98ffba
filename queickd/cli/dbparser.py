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

    def action(name: str, help: str, description: str, store: str = "store URL") -> Any:
        """One action: its parser, its --store, and its handler db_NAME in cli/run.py."""
        p = dbsub.add_parser(name, help=help, description=description)
        opt(p, "--store", store, DEFAULTS.store)
        p.set_defaults(handler=local("db_" + name.replace("-", "_")))
        return p

    action("migrate", "create or upgrade the store's schema (idempotent)",
           "Create or upgrade the schema of the store (the daemon does this at start too). Safe to run "
           "again, and from several hosts at once.")
    bak = action("backup", "copy the SQLite store to PATH, safely, while the daemon runs",
                 "Copy the SQLite store to a new file PATH online (SQLite's backup API, one read snapshot): "
                 "the copy holds every job acknowledged before it began. Progress goes to stderr for a "
                 "large store. Not for PostgreSQL (pg_dump).")
    bak.add_argument("path", help="the new file to write (it must not exist)")
    action("clear-budgets", "remove the cost budgets in force from a PostgreSQL store",
           "Remove every cost budget in force from the PostgreSQL database: every daemon and worker on "
           "it follows at once. One whose --config names [budgets] writes its own again when it next "
           "starts, so remove them there too. On SQLite the daemon's config file holds the budgets: edit "
           "it and restart.")
    action("check", "check the SQLite store as the daemon does at start",
           "Check the SQLite store without writing to it: the file against its marker (PATH.id), its "
           "header, PRAGMA quick_check and its schema. Exits 0 if it is sound, 1 if it is damaged (the "
           "daemon would refuse it, exit 78).")
    rec = action("recover", "copy every readable job of a damaged SQLite store into a new file",
                 "Copy every row that can still be read from a damaged SQLite store into the new file TO "
                 "(sqlite3's .recover where it works, else a row-by-row salvage, then a read of the pages "
                 "no readable index leads to). The damaged file is never written. Stop the daemon first.",
                 store="the damaged store's URL")
    rec.add_argument("--to", required=True, metavar="PATH", help="the new file to write (it must not exist)")
    vac = action("vacuum", "rewrite a stopped SQLite store compact, with a new store's page size",
                 "Rewrite the SQLite store in place: its free pages dropped and its pages made "
                 f"{SQLITE_PAGE} bytes, as a new store's (a store made by an earlier release keeps 4096-byte "
                 "pages, and writes about three times the bytes a job: what wears an SD card). A crash "
                 "midway leaves the store as it was. The daemon must be stopped; the disk needs room for "
                 "twice the store meanwhile.")
    vac.add_argument("--page-size", type=int, default=SQLITE_PAGE, choices=SQLITE_PAGE_SIZES, metavar="BYTES",
                     help=f"the page size to rewrite it with (default: {SQLITE_PAGE}; a power of two, 512-65536)")
