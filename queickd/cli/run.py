"""`queick run`, `queick worker` and `queick db ...`: the commands that start a process or
open a store themselves rather than talk to a daemon. Owns their exit statuses (78 for a
configuration error or a damaged store, 79 for a version mismatch, 1 for what systemd
should retry)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import socket
import sqlite3
import sys
import time
from collections.abc import Iterator
from typing import TypeVar

from .. import config as config_file
from .. import log
from ..daemon import Daemon
from ..settings import EX_VERSION, Config
from ..store.postgres.schema import VersionMismatchError
from ..store.sqlite.check import DamagedStoreError
from .options import EX_CONFIG, duration

_C = TypeVar("_C")


def given(config_class: type[_C], a: argparse.Namespace) -> _C:
    """A config dataclass from the options given (those left at None keep its defaults)."""
    fields = {f.name for f in dataclasses.fields(config_class)}  # type: ignore[arg-type]
    return config_class(**{k: v for k, v in vars(a).items() if k in fields and v is not None})


def configuration_error(a: argparse.Namespace, e: ValueError) -> str:
    """The message of a configuration error, with where the settings it names came from
    (a flag, a QUEICKD_* variable, the config file): a value set in a unit's environment
    file is not where one looks first."""
    message = str(e)
    named = [f"{dest} = {getattr(a, dest, None)!r} from {origin}"
             for dest, origin in getattr(a, "origins", {}).items()
             if re.search(rf"(?<![\w-]){re.escape(dest)}(?![\w-])", message)
             or "--" + dest.replace("_", "-") in message]
    return f"queick: configuration error: {message}" + (f" ({'; '.join(named)})" if named else "")


def run_daemon(a: argparse.Namespace) -> int:
    try:
        log.setup(a.log_level, getattr(a, "log_filepath", None))  # QUEICKD_LOG_LEVEL skips the flag's choices: ValueError
        daemon = Daemon(given(Config, a))
        finished = daemon.run_forever()
    except DamagedStoreError as e:  # restarting cannot mend the file: EX_CONFIG, not retried
        print(f"queick: cannot start: {e}", file=sys.stderr)
        return EX_CONFIG
    except ValueError as e:
        print(configuration_error(a, e), file=sys.stderr)
        return EX_CONFIG
    except VersionMismatchError as e:
        print(f"queick: {e}", file=sys.stderr)
        return EX_VERSION
    except socket.gaierror as e:  # --bind or --http names no address: restarting cannot help
        print(f"queick: configuration error: cannot resolve the address to listen on: {e}", file=sys.stderr)
        return EX_CONFIG
    except OSError as e:  # the port is taken, the store's directory is not writable (yet), ...
        print(f"queick: cannot start: {e}", file=sys.stderr)
        return 1
    if not finished:
        # Worker threads still in a job's call: the store is consistent (their jobs are
        # recovered as orphans next time, or cancelled already), so leave without waiting.
        sys.stderr.flush()
        os._exit(daemon.exit_status)
    return daemon.exit_status


def run_worker(a: argparse.Namespace) -> int:
    from ..services.workerproc import run
    from ..settings import WorkerConfig

    if a.check:
        return check_worker(a)
    try:
        log.setup(a.log_level)
        config = given(WorkerConfig, a)
        if a.config:  # the daemons' file: its [budgets] (made the database's) and budget-patience
            values = config_file.load(a.config, {f.name for f in dataclasses.fields(Config)})
            config.budgets = values.get("budgets", {})
            config.fair_shares = values.get("fair_shares", {})
            try:
                config.budget_patience = duration(str(values.get("budget_patience", config.budget_patience)))
            except argparse.ArgumentTypeError as e:
                raise config_file.ConfigFileError(f"{a.config}: budget_patience: {e}") from None
        return run(config)
    except ValueError as e:
        print(configuration_error(a, e), file=sys.stderr)
        return EX_CONFIG
    except OSError as e:  # the database cannot be reached: systemd tries again later
        print(f"queick: cannot start: {e}", file=sys.stderr)
        return 1


def check_worker(a: argparse.Namespace) -> int:
    """`queick worker --check`: 0 if a worker of this host serving --pool (any, without one)
    beats in the store, else 1 with a line saying why. One query of the worker registry;
    never a traceback, never a status but 0 or 1 (Docker reserves 2)."""
    from ..services.workerproc import beating_here

    try:
        if not a.store.startswith(("postgresql://", "postgres://")):
            raise ValueError("queick worker needs a shared store: --store postgresql://...")
        from ..store.postgres.store import PostgresStore

        store = PostgresStore(a.store, migrate=False)
        try:
            found, host = beating_here(store, a.pool)
        finally:
            store.close()
    except Exception as e:  # unreachable, no schema, no psycopg: whatever it is, not healthy
        print(f"queick worker --check: cannot read the worker registry: {e}".strip(), file=sys.stderr)
        return 1
    pools = f" serving {','.join(a.pool)}" if a.pool else ""
    if found is None:
        print(f"queick worker --check: no worker process of this host ({host}){pools} beats in {store.url}",
              file=sys.stderr)
        return 1
    print(f"worker pid {found['pid']} on {host} beats (last {found['silent_for']:.1f} s ago, every "
          f"{found['heartbeat']:g} s) serving {','.join(found['pools'])}")
    return 0


def db_migrate(a: argparse.Namespace) -> int:
    from ..store import open_store
    from ..store.contract.fleet import FleetStore

    try:
        store = open_store(a.store)  # opening migrates
    except (DamagedStoreError, VersionMismatchError, ValueError) as e:
        print(f"queick: {e}", file=sys.stderr)
        return EX_VERSION if isinstance(e, VersionMismatchError) else EX_CONFIG
    except OSError as e:
        print(f"queick: cannot migrate: {e}", file=sys.stderr)
        return 1
    v = store.versions() if isinstance(store, FleetStore) else None  # only a shared store records them
    shown = f" (queickd {v[0]}, schema {v[1]})" if v else ""
    store.close()
    print(f"{a.store}: schema up to date{shown}")
    return 0


def db_clear_budgets(a: argparse.Namespace) -> int:
    """`queick db clear-budgets`: the budgets in force on a shared store removed (each
    claimer reads them in its next claim; the others are told at once)."""
    from ..core.policy.claim import Limits
    from ..store import open_store
    from ..store.contract.fleet import FleetStore

    try:
        store = open_store(a.store) if a.store.startswith(("postgres://", "postgresql://")) else None
    except (ValueError, OSError, VersionMismatchError) as e:
        print(f"queick: cannot open {a.store}: {e}", file=sys.stderr)
        return 1
    if not isinstance(store, FleetStore):
        print(f"queick: {a.store} is not a PostgreSQL store: its budgets are the daemon's config file's "
              "([budgets.pools], [budgets.groups]); edit it and restart the daemon", file=sys.stderr)
        return EX_CONFIG
    try:
        changes = store.adopt_budgets(Limits())
    except store.UNAVAILABLE as e:
        print(f"queick: cannot clear the budgets: {e}", file=sys.stderr)
        return 1
    finally:
        store.close()
    if not changes:
        print(f"{store.url}: no budgets were in force")
    for c in changes:
        print(f"{store.url}: removed the budget of {c.kind} {c.name!r} ({c.old:g} units)")
    return 0


def _sqlite_file(a: argparse.Namespace, command: str, done: str = "backed up") -> str:
    """The file of the SQLite store --store names; for another store, a usage error (exit 2,
    as argparse's) saying that `queick db command` is only for SQLite stores (what is `done`
    to them)."""
    from ..store.sqlite import backup as sqlitebackup

    try:
        return sqlitebackup.sqlite_path(a.store, done)
    except ValueError as e:
        print(f"queick db {command}: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def db_backup(a: argparse.Namespace) -> int:
    """`queick db backup PATH`: an online copy of the SQLite store, with progress on stderr."""
    from ..store.sqlite import backup as sqlitebackup

    source = _sqlite_file(a, "backup")
    shown = [-1]

    def progress(copied: int, total: int) -> None:
        percent = copied * 100 // max(total, 1)
        if total > sqlitebackup.STEP_PAGES and percent // 10 != shown[0]:  # a large file: every 10 %
            shown[0] = percent // 10
            print(f"queick db backup: {percent}% ({copied} of {total} pages)", file=sys.stderr, flush=True)

    started = time.monotonic()
    try:
        pages = sqlitebackup.backup(source, a.path, progress,
                                    note=lambda text: print(f"queick db backup: {text}", file=sys.stderr))
    except (OSError, sqlite3.Error) as e:
        print(f"queick db backup: {e}", file=sys.stderr)
        return 1
    size = os.path.getsize(a.path)
    print(f"{a.store} backed up to {a.path}: {pages} pages, {size / 1e6:.1f} MB in "
          f"{time.monotonic() - started:.1f} s")
    return 0


def db_check(a: argparse.Namespace) -> int:
    """`queick db check`: the checks the daemon makes at start; 0 if sound, 1 if damaged."""
    from ..store.sqlite import salvage as sqlite_salvage

    path = _sqlite_file(a, "check", "checked")
    sound, found = sqlite_salvage.check(path)
    print(found, file=sys.stdout if sound else sys.stderr)
    if not sound and os.path.exists(path):
        print(f"queick db check: to copy every readable job into a new file: queick db recover "
              f"--store {a.store} --to NEW.db", file=sys.stderr)
    return 0 if sound else 1


class _ServedError(Exception):
    """A daemon serves the store: a command that needs it stopped does not start."""


@contextlib.contextmanager
def _stopped(path: str) -> Iterator[None]:
    """The store's lock (PATH.lock) held shared while a command works on its file: a daemon
    serving it raises _ServedError, and one started meanwhile refuses to start (it takes the
    lock exclusively) until the command is done."""
    import fcntl

    try:
        fd = os.open(path + ".lock", os.O_RDONLY)
    except FileNotFoundError:
        yield  # never served: no daemon holds it, and one that starts now makes a new lock
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _ServedError(f"{path} is served by a running daemon; stop it first") from None
        yield
    finally:
        os.close(fd)


def db_recover(a: argparse.Namespace) -> int:
    """`queick db recover --to PATH`: every readable job of a damaged store into a new file."""
    from ..store.sqlite import salvage as sqlite_salvage

    path = _sqlite_file(a, "recover", "recovered")
    try:
        with _stopped(path):
            started = time.monotonic()
            report = sqlite_salvage.recover(path, a.to)
    except _ServedError as e:
        print(f"queick db recover: {e} (or copy a live store with 'queick db backup')", file=sys.stderr)
        return 1
    except (OSError, sqlite3.Error) as e:
        print(f"queick db recover: {e}", file=sys.stderr)
        return 1
    states = ", ".join(f"{n} {s}" for s, n in sorted(report.states.items())) or "none"
    print(f"recovered {report.jobs} jobs ({states}) from {path} into {a.to} by {report.method} "
          f"in {time.monotonic() - started:.1f} s; {path} is left as it was")
    for what in report.notes:
        print(f"note: {what}")
    for what in report.unreadable:
        print(f"queick db recover: could not read {what}", file=sys.stderr)
    print(f"next: check it ('queick db check --store sqlite:///{a.to}'), then start the daemon on it "
          f"(--store sqlite:///{a.to})")
    return 0


def db_vacuum(a: argparse.Namespace) -> int:
    """`queick db vacuum`: the stopped store rewritten compact, with a new store's page size."""
    from ..store.sqlite import vacuum as sqlite_vacuum

    path = _sqlite_file(a, "vacuum", "vacuumed")
    print(f"queick db vacuum: rewriting {path}; a crash or a power cut midway leaves it as it was",
          file=sys.stderr)
    try:
        with _stopped(path):
            started = time.monotonic()
            done = sqlite_vacuum.vacuum(path, a.page_size)
    except DamagedStoreError as e:
        print(f"queick db vacuum: {e}", file=sys.stderr)
        return EX_CONFIG
    except (_ServedError, OSError, sqlite3.Error) as e:
        print(f"queick db vacuum: {e}", file=sys.stderr)
        return 1
    print(f"vacuumed {path}: {done.jobs:,} jobs, pages of {done.page_before} -> {done.page_after} bytes, "
          f"{done.bytes_before / 1e6:.1f} -> {done.bytes_after / 1e6:.1f} MB in {time.monotonic() - started:.1f} s")
    return 0
