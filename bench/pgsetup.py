"""bench.pg's settings, target names and pins, the peers' virtualenvs, whether queickd can
run its PostgreSQL fleet, and the fresh database of each run. Starts no target."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.processes import (
    BENCH_DIR,
    CACHE_DIR,
    _clean_env,
    log,
)

PROBES = BENCH_DIR / "pg_probes.py"
PGQUEUER_APP = BENCH_DIR / "pgqueuer_app.py"
PROCRASTINATE_APP = BENCH_DIR / "procrastinate_app.py"

# What each peer venv holds: the peer and the driver it runs on, pinned.
PGQUEUER_PINS = {"pgqueuer": "1.6.0", "asyncpg": "0.32.0"}
PROCRASTINATE_PINS = {"procrastinate": "3.10.0", "psycopg": "3.3.9"}
PGQUEUER = f"pgqueuer {PGQUEUER_PINS['pgqueuer']}"
PROCRASTINATE = f"procrastinate {PROCRASTINATE_PINS['procrastinate']}"
PEERS = (PGQUEUER, PROCRASTINATE)
QUEICKD_ENQUEUE = "queickd pg (daemon)"
QUEICKD_DIRECT = "queickd pg (direct)"  # queickd.pg on the client's own connection
APP_ROW = "app row alone"  # an application's transaction: its INSERT, then COMMIT
APP_ROW_JOB = "app row + queickd.pg.enqueue"  # the same with a job enqueued beside it
# targets whose probe writes through queickd.pg on a schema a daemon migrated: their probe's name
# the app-tx scenario's metrics, per transaction
APP_WALL, APP_CPU = "wall time per transaction", "client+server CPU per transaction"
APP_INSERT, APP_ENQUEUE = "the INSERT statement alone, wall", "the enqueue call alone, wall"
DIRECT_PROBES = {QUEICKD_DIRECT: "direct", APP_ROW: "approw", APP_ROW_JOB: "approwjob"}
RAW_ROWS = "bare rows, psycopg (no queue)"  # the floors: no queue at all
ONE_ROW = "rows/s, one per statement"  # bare rows, one autocommit INSERT each
JOB_ROWS = "job rows/s, one per statement, id returned (queickd's table, no rules)"
RAW_LOOPBACK = "loopback TCP, 2 processes"
WORKER_UP = re.compile(r"worker serving pool")
CRASH_JOB_SECONDS = 0.05  # each crash job works this long, so some are running at the kill


def queickd_target(k: int) -> str:
    return f"queickd pg, {k} worker proc{'s' if k > 1 else ''}"


# --- settings ----------------------------------------------------------------------------------------
@dataclass
class Settings:
    rounds: int
    quick: bool
    admin_url: str  # the maintenance database: postgresql://user@host:port/postgres
    tmp_root: Path
    enqueue_jobs: int = 5_000
    chunk: int = 1000
    e2e_jobs: int = 5_000
    concurrency: int = 4
    worker_procs: list[int] = field(default_factory=lambda: [1, 2, 4])
    peer_processes: int = 1
    idle_warmup: float = 30.0
    idle_seconds: float = 60.0
    crash_acks: int = 1_000
    crash_recovery_max: float = 180.0
    queickd_path: Path | None = None  # the directory holding the queickd package
    queickd_skip: str | None = None  # why the queickd targets cannot run, if they cannot
    pgqueuer_venv: Path = CACHE_DIR / "pgqueuer-venv"
    procrastinate_venv: Path = CACHE_DIR / "procrastinate-venv"
    pythons: dict[str, Path] = field(default_factory=dict)  # target -> its venv's python
    venv_errors: dict[str, str] = field(default_factory=dict)

    def python(self, peer: str) -> Path:
        if peer not in self.pythons:
            raise RuntimeError(f"no {peer} venv: {self.venv_errors.get(peer, 'not prepared')}")
        return self.pythons[peer]


def split(total: int, parts: int) -> list[int]:
    """total job slots over parts processes, as evenly as possible (4 over 4: 1 1 1 1)."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


# --- the peers' virtualenvs -----------------------------------------------------------------------
def ensure_venv(venv: Path, pins: dict[str, str]) -> Path:
    """Create (or reuse) a virtualenv holding exactly these pinned distributions; returns its
    python. Moved venvs work too: only VENV/bin/python is ever called."""
    py = venv / "bin" / "python"
    check = [str(py), "-c", "import importlib.metadata as m, json, sys; "
             f"print(json.dumps({{d: m.version(d) for d in {list(pins)!r}}}))"]

    def holds() -> bool:
        r = subprocess.run(check, capture_output=True, text=True, timeout=60, env=_clean_env())
        return r.returncode == 0 and json.loads(r.stdout) == pins

    if py.exists():
        if holds():
            return py
        log(f"{venv} does not hold {pins}; installing them")
    else:
        log(f"creating the venv {venv} ({pins})")
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    *(f"{d}=={v}" for d, v in pins.items())], check=True, timeout=900, env=_clean_env())
    if not holds():
        raise RuntimeError(f"{pins} did not install into {venv}")
    return py


def check_queickd(path: Path | None, cwd: Path) -> str | None:
    """Why queickd at path cannot run the PostgreSQL fleet (no psycopg, no `queick worker`),
    or None when it can."""
    if path is None:
        return "queickd is not importable"
    if importlib.util.find_spec("psycopg") is None:
        return "psycopg is not installed (pip install -e '.[postgres]')"
    # an older queickd treats an unknown command as `run`: look at what answered
    r = subprocess.run([sys.executable, "-m", "queickd", "worker", "--help"], capture_output=True, text=True,
                       timeout=60, cwd=cwd, env=_queickd_env(path))
    if r.returncode != 0 or not r.stdout.startswith("usage: queick worker"):
        return f"queickd in {path} has no `queick worker` (no PostgreSQL fleet in this version)"
    return None


def _queickd_env(path: Path | None) -> dict[str, str]:
    env = _clean_env()
    if path is not None:
        env["PYTHONPATH"] = str(path)
    return env


# --- the database -------------------------------------------------------------------------------------
_DB_SEQ = itertools.count(1)


class Database:
    """A fresh database on the server for one run, dropped WITH (FORCE) on leaving. The
    bench's own queries go to the maintenance database, so they never count as the run's."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.name = f"queickd_bench_{os.getpid()}_{next(_DB_SEQ)}"
        base, _, _ = admin_url.rpartition("/")
        self.dsn = f"{base}/{self.name}"
        self._admin: Any = None

    def __enter__(self) -> Database:
        import psycopg

        self._admin = psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10)
        self._admin.execute(f'CREATE DATABASE "{self.name}"')
        return self

    def __exit__(self, *exc: object) -> None:
        if self._admin is None:
            return
        try:
            self._admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        except Exception as e:  # a leftover database is named in the log, the run goes on
            log(f"could not drop the database {self.name}: {e}")
        finally:
            self._admin.close()
            self._admin = None

    def transactions(self) -> int:
        """Commits + rollbacks in this database so far (pg_stat_database)."""
        self._admin.execute("SELECT pg_stat_clear_snapshot()")
        row = self._admin.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
                                  (self.name,)).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def transactions_once_gone(self, timeout: float = 20.0) -> int:
        """transactions() once no server process of this database is left. A backend
        reports its counts to pg_stat_database at most once a second while busy and 10 s
        after it last went idle, but at once when it exits: a count read while the run's
        processes are still connected misses up to their last 10 s (half of a short run's
        transactions). Call it after the run's processes were stopped."""
        deadline = time.monotonic() + timeout
        while self.backends():
            if time.monotonic() > deadline:
                raise RuntimeError(f"server processes of {self.name} still connected {timeout:.0f} s after "
                                   "their clients stopped")
            time.sleep(0.05)
        return self.transactions()

    def wal_bytes(self) -> int:
        """Where the server's WAL insert position is, in bytes: the difference over a run is
        what every database of the server wrote to its WAL meanwhile (the run's target is
        the only one at work; a checkpoint in the window adds full-page images)."""
        return int(self._admin.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()[0])

    def backends(self) -> list[int]:
        """Server processes connected to this database."""
        self._admin.execute("SELECT pg_stat_clear_snapshot()")
        rows = self._admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.name,)).fetchall()
        return sorted(int(r[0]) for r in rows)


def server_version(admin_url: str) -> str:
    import psycopg

    with psycopg.connect(admin_url, connect_timeout=10) as c:
        return str(c.execute("SHOW server_version").fetchone()[0])
