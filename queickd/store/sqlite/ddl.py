"""The DDL helpers SQLite's migration steps share (schema.py, resource_steps.py)."""

from __future__ import annotations

import sqlite3


def run_script(c: sqlite3.Connection, script: str) -> None:
    """Run a script statement by statement: executescript would commit the step's
    transaction before its first statement."""
    stmt = ""
    for line in script.splitlines(keepends=True):
        stmt += line
        if sqlite3.complete_statement(stmt):
            c.execute(stmt)
            stmt = ""
    if stmt.strip() and not stmt.strip().startswith("--"):
        raise ValueError(f"incomplete statement in a migration: {stmt.strip()[:80]}")


def add_column(c: sqlite3.Connection, table: str, column: str, decl: str) -> None:
    """ALTER TABLE ADD COLUMN unless the column is there: a step may meet a file that a
    crash or a hand-edited version left half way, and must still apply."""
    if column not in {r[1] for r in c.execute(f"PRAGMA table_info({table})")}:
        c.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
