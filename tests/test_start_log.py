"""The line a daemon logs when it is ready says what it runs with: the store's durability as
that store has it, and the pool's size as configured (fixed, or an adaptive range)."""

from __future__ import annotations


def _listening(d) -> str:
    return d.wait_for_line(r"listening on \S+:\d+ .*").group(0)


def test_start_log_names_the_fixed_pool_size_and_sqlites_durability(start_daemon):
    line = _listening(start_daemon(None, "--durability", "normal", workers=3))
    assert line.endswith("queue.db, durability normal, 3 workers)"), line


def test_start_log_names_the_adaptive_range(start_daemon):
    line = _listening(start_daemon(None, "--min-workers", "1", "--max-workers", "8"))
    assert line.endswith(", workers 1-8 (adaptive))"), line


def test_postgres_start_log_names_no_sqlite_durability(pg_fresh_database, start_daemon):
    line = _listening(start_daemon(pg_fresh_database, workers=2))
    # --durability is SQLite's (its default "full" is in the config either way): PostgreSQL's
    # commits are as durable as the server's synchronous_commit says.
    assert "durability full" not in line, line
    assert line.endswith(", durability: the server's synchronous_commit = on, 2 workers)"), line
