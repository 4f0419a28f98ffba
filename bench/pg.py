"""queickd on PostgreSQL against pgqueuer and procrastinate, on the same local server in one
run: enqueue rate, end-to-end rate of no-op jobs, idle load on the database, and kill -9 of
the workers under load.

    python -m bench.pg --quick             # a smoke run: fewer jobs, one round, short idle
    python -m bench.pg                     # 3 rounds of everything
    python -m bench.pg --only e2e,idle --rounds 5 --json pg.json
    python -m bench.pg --help

queickd targets: one daemon (`queick run --workers 0`: the protocol, no jobs) plus k external
workers (`queick worker`, k = 1, 2, 4) sharing --concurrency job slots between them. queickd
is imported from wherever this Python finds it (PYTHONPATH included); the path is passed on
to every queickd process, and printed in the header.

The peers live in virtualenvs of their own, created on first use and reused when their
pinned versions are there (--pgqueuer-venv / $BENCH_PGQUEUER_VENV, --procrastinate-venv /
$BENCH_PROCRASTINATE_VENV, default bench/.bench-cache/NAME-venv); they are always run as
VENV/bin/python -m ..., never through a console script or PATH. Each run copies
pgqueuer_app.py / procrastinate_app.py and benchjobs.py into its temp dir, where the peer's
workers and client probes run. Peers get --peer-processes worker processes (default 1)
sharing the same --concurrency.

Every run gets a fresh database (CREATE DATABASE, dropped WITH (FORCE) afterwards) and temp
dir; targets alternate over the rounds. Only loopback addresses are used. Every process this
script starts is in its own process group and is killed at the end, even on error.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.processes import (
    BENCH_DIR,
    CACHE_DIR,
    JOBS_FILE,
    LISTENING,
    LineWaiter,
    _clean_env,
    _kill_group,
    _reap,
    _spawn,
    default_queickd_path,
    group_usage,
    kill_all,
    log,
)
from bench.report import Results, _fmt, _fs_type
from bench.run import TargetSkippedError, print_scenarios, run_rounds, stop_on_sigterm

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

    def backends(self) -> list[int]:
        """Server processes connected to this database."""
        self._admin.execute("SELECT pg_stat_clear_snapshot()")
        rows = self._admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.name,)).fetchall()
        return sorted(int(r[0]) for r in rows)


def server_version(admin_url: str) -> str:
    import psycopg

    with psycopg.connect(admin_url, connect_timeout=10) as c:
        return str(c.execute("SHOW server_version").fetchone()[0])


# --- processes ----------------------------------------------------------------------------------------
def run_probe(python: Path | str, kind: str, args: list[str], cwd: Path | None, env: dict[str, str],
              timeout: float) -> dict[str, Any]:
    """Run one measurement in a fresh process; returns its JSON result."""
    proc = _spawn([str(python), str(PROBES), kind, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                  text=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"probe {kind} took over {timeout:.0f} s") from None
    finally:
        _kill_group(proc)
        _reap(proc)
    if proc.returncode != 0:
        raise RuntimeError(f"probe {kind} failed with {proc.returncode}:\n{(out + err)[-3000:]}")
    lines = [line for line in out.splitlines() if line.strip()]
    if not lines:
        raise RuntimeError(f"probe {kind} printed no result:\n{err[-3000:]}")
    return json.loads(lines[-1])


@dataclass
class Proc:
    """A started process (its own process group) and its drained stderr."""

    proc: subprocess.Popen
    out: LineWaiter

    @classmethod
    def start(cls, cmd: list[str], cwd: Path, env: dict[str, str]) -> Proc:
        p = _spawn(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        return cls(p, LineWaiter(p))

    def kill(self) -> None:
        _kill_group(self.proc)
        _reap(self.proc)

    def check_alive(self, what: str) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {self.proc.returncode}:\n{self.out.tail()}")


@dataclass
class Served:
    """A target started on a fresh database: its processes and how its probes reach it."""

    target: str
    system: str  # probe prefix: queickd / pgqueuer / procrastinate
    s: Settings
    db: Database
    d: Path
    daemon: Proc | None = None
    workers: list[Proc] = field(default_factory=list)
    worker_cmds: list[list[str]] = field(default_factory=list)
    port: int = 0

    @property
    def python(self) -> Path | str:
        return sys.executable if self.system == "queickd" else self.s.python(self.target)

    @property
    def env(self) -> dict[str, str]:
        if self.system == "queickd":
            return _queickd_env(self.s.queickd_path)
        return {**_clean_env(), "BENCH_PG_DSN": self.db.dsn}

    def probe(self, what: str, *args: str, timeout: float) -> dict[str, Any]:
        base = ["--dsn", self.db.dsn, "--port", str(self.port), "--dir", str(self.d)]
        return run_probe(self.python, f"{self.system}-{what}", base + list(args), self.d, self.env, timeout)

    def start_workers(self, warm_up: bool = True) -> None:
        self.workers = [Proc.start(cmd, self.d, self.env) for cmd in self.worker_cmds]
        if self.system == "queickd":
            for w in self.workers:
                w.out.wait_for(WORKER_UP, timeout=60.0)
        if warm_up:  # one real job through the system: imports done, listeners up, before anything is timed
            self.probe("e2e", "--n", "1", "--chunk", "1", "--name", "warmup", "--max-seconds", "90", timeout=120.0)

    def kill_workers(self) -> None:
        for w in self.workers:
            _kill_group(w.proc, signal.SIGKILL)
        for w in self.workers:
            _reap(w.proc)

    def check_alive(self) -> None:
        if self.daemon is not None:
            self.daemon.check_alive(f"{self.target} daemon")
        for i, w in enumerate(self.workers):
            w.check_alive(f"{self.target} worker {i + 1}")

    def pgids(self) -> list[int]:
        return [p.proc.pid for p in ([self.daemon] if self.daemon else []) + self.workers]

    def cpu(self) -> dict[int, float]:
        """CPU seconds of every live process of the target's process groups."""
        out: dict[int, float] = {}
        for pgid in self.pgids():
            out.update({pid: cpu for pid, (cpu, _) in group_usage(pgid).items()})
        return out


@contextlib.contextmanager
def serve(s: Settings, target: str, db: Database, d: Path, with_workers: bool) -> Iterator[Served]:
    """Start target on db (queickd: its daemon, which migrates the schema; peers: their
    schema installed by their own CLI), and its workers if with_workers; killed on leaving."""
    if target == QUEICKD_ENQUEUE or target.startswith("queickd pg,"):
        if s.queickd_skip:
            raise TargetSkippedError(s.queickd_skip)
        srv = Served(target, "queickd", s, db, d)
        k = int(target.split(", ")[1].split()[0]) if target != QUEICKD_ENQUEUE else 0
        common = ["--store", db.dsn, "--app-dir", str(BENCH_DIR), "--log-level", "info"]
        srv.worker_cmds = [[sys.executable, "-m", "queickd", "worker", "--workers", str(w), *common]
                           for w in split(s.concurrency, k)] if k else []
        daemon_cmd = [sys.executable, "-m", "queickd", "run", "--bind", "127.0.0.1", "--port", "0",
                      "--workers", "0", *common]
    elif target == PGQUEUER:
        srv = Served(target, "pgqueuer", s, db, d)
        py = str(s.python(target))
        shutil.copy(PGQUEUER_APP, d / PGQUEUER_APP.name)
        # max_concurrent_tasks must be at least twice the batch size (pgqueuer's rule)
        srv.worker_cmds = [[py, PGQUEUER_APP.name, "--max-concurrent-tasks", str(c), "--batch-size", str(max(1, c // 2))]
                           for c in split(s.concurrency, s.peer_processes)]
        schema = [py, "-m", "pgqueuer", "--pg-dsn", db.dsn, "install"]
    elif target == PROCRASTINATE:
        srv = Served(target, "procrastinate", s, db, d)
        py = str(s.python(target))
        shutil.copy(PROCRASTINATE_APP, d / PROCRASTINATE_APP.name)
        app = ["--app", "procrastinate_app.app"]
        srv.worker_cmds = [[py, "-m", "procrastinate", *app, "worker", "--concurrency", str(c)]
                           for c in split(s.concurrency, s.peer_processes)]
        schema = [py, "-m", "procrastinate", *app, "schema", "--apply"]
    else:
        raise ValueError(target)
    shutil.copy(JOBS_FILE, d / JOBS_FILE.name)
    try:
        if srv.system == "queickd":
            srv.daemon = Proc.start(daemon_cmd, d, srv.env)
            m = srv.daemon.out.wait_for(LISTENING, timeout=60.0)
            if m.group(1) != "127.0.0.1":
                raise RuntimeError(f"queickd listens on {m.group(1)}, not loopback")
            srv.port = int(m.group(2))
        else:
            r = subprocess.run(schema, cwd=d, capture_output=True, text=True, timeout=120, env=srv.env)
            if r.returncode != 0:
                raise RuntimeError(f"{target}: schema install failed:\n{(r.stdout + r.stderr)[-2000:]}")
        if with_workers:
            srv.start_workers()
        yield srv
    finally:
        for p in srv.workers + ([srv.daemon] if srv.daemon else []):
            p.kill()


@contextlib.contextmanager
def fresh(s: Settings, name: str) -> Iterator[tuple[Database, Path]]:
    """A new database and a new temp dir, both gone afterwards."""
    with Database(s.admin_url) as db, tempfile.TemporaryDirectory(prefix=f"queickd-pgbench-{name}-",
                                                                     dir=s.tmp_root) as d:
        yield db, Path(d)


# --- scenarios ----------------------------------------------------------------------------------------
def run_enqueue(s: Settings, res: Results, scenario: str, target: str) -> None:
    """N no-op jobs from one client process, nothing consuming them: one job per request
    (single) or s.chunk per request (batch). Each request is acknowledged after its commit."""
    mode = scenario.removeprefix("enqueue-")
    n = s.enqueue_jobs
    with fresh(s, "enqueue") as (db, d), serve(s, target, db, d, with_workers=False) as srv:
        cpu0 = sum(srv.cpu().values())
        probe = srv.probe("enqueue", "--mode", mode, "--n", str(n), "--chunk", str(s.chunk),
                          timeout=60.0 + n / 50)
        server_cpu = sum(srv.cpu().values()) - cpu0
        srv.check_alive()
    res.add(scenario, "enqueue rate", target, "jobs/s", probe["rate"], higher_is_better=True,
            raw={**probe, "server_cpu_s": server_cpu})
    res.add(scenario, "client+daemon CPU per job", target, "µs", (probe["client_cpu_s"] + server_cpu) / n * 1e6,
            higher_is_better=False)


def run_e2e(s: Settings, res: Results, scenario: str, target: str) -> None:
    """N jobs that each append one byte, enqueued in batches of s.chunk while the workers run;
    timed from the first enqueue until every job ran and no job is unfinished in the
    database. The file must hold exactly N bytes."""
    n = s.e2e_jobs
    with fresh(s, "e2e") as (db, d), serve(s, target, db, d, with_workers=True) as srv:
        cpu0, tx0, be0 = srv.cpu(), db.transactions(), _cpu_of(db.backends())
        probe = srv.probe("e2e", "--n", str(n), "--chunk", str(s.chunk), "--max-seconds", str(60 + n / 20),
                          timeout=90.0 + n / 20)
        cpu1, tx1, be1 = srv.cpu(), db.transactions(), _cpu_of(db.backends())
        srv.check_alive()
    if probe["final_bytes"] != n:
        raise RuntimeError(f"{probe['final_bytes']} bytes for {n} jobs: some job ran twice")
    target_cpu = sum(cpu1[p] - cpu0[p] for p in set(cpu0) & set(cpu1))
    be_cpu = sum(be1[p] - be0[p] for p in set(be0) & set(be1))
    res.add(scenario, "jobs/s", target, "jobs/s", probe["rate"], higher_is_better=True,
            raw={**probe, "target_cpu_s": target_cpu, "backend_cpu_s": be_cpu, "transactions": tx1 - tx0})
    res.add(scenario, "CPU per job, client + target", target, "µs", (probe["client_cpu_s"] + target_cpu) / n * 1e6,
            higher_is_better=False)
    res.add(scenario, "CPU per job, its server backends", target, "µs", be_cpu / n * 1e6, higher_is_better=False)
    res.add(scenario, "transactions per job", target, "xacts", (tx1 - tx0) / n, higher_is_better=False)


def run_idle(s: Settings, res: Results, scenario: str, target: str) -> None:
    """An empty queue with its workers up: after a warm-up, the transactions committed or
    rolled back in the run's database (pg_stat_database) and the CPU of the target's
    processes and of their server backends, per minute."""
    with fresh(s, "idle") as (db, d), serve(s, target, db, d, with_workers=True) as srv:
        time.sleep(s.idle_warmup)
        backends0 = db.backends()
        tx0, cpu0, be0, t0 = db.transactions(), srv.cpu(), _cpu_of(backends0), time.monotonic()
        time.sleep(s.idle_seconds)
        tx1, cpu1, t1 = db.transactions(), srv.cpu(), time.monotonic()
        backends1 = db.backends()
        be1 = _cpu_of(backends1)
        srv.check_alive()
    per_min = 60.0 / (t1 - t0)
    cpu = sum(cpu1[p] - cpu0[p] for p in set(cpu0) & set(cpu1))
    be_cpu = sum(be1[p] - be0[p] for p in set(be0) & set(be1))
    raw = {"warmup_s": s.idle_warmup, "measured_s": t1 - t0, "transactions": tx1 - tx0, "cpu_s": cpu,
           "backend_cpu_s": be_cpu, "backends_before": backends0, "backends_after": backends1}
    res.add(scenario, "transactions", target, "/min", (tx1 - tx0) * per_min, higher_is_better=False, raw=raw)
    res.add(scenario, "CPU, target processes", target, "ms/min", cpu * 1000 * per_min, higher_is_better=False)
    res.add(scenario, "CPU, its server backends", target, "ms/min", be_cpu * 1000 * per_min,
            higher_is_better=False)
    res.add(scenario, "connections", target, "", len(backends1), higher_is_better=False)


def _cpu_of(pids: list[int]) -> dict[int, float]:
    """CPU seconds of these processes (server backends, which are no group of ours)."""
    from bench.processes import proc_cpu

    return {p: proc_cpu(p) for p in pids if os.path.exists(f"/proc/{p}")}


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return []


def run_crash(s: Settings, res: Results, scenario: str, target: str) -> None:
    """A client enqueues jobs that work 50 ms, then append their token to tokens.out, one at
    a time, and logs each ack while the workers run; after s.crash_acks acks every worker
    process gets SIGKILL (queickd's daemon, which only takes requests, lives on) and the
    client stops; the workers restart at once and the bench waits until every acknowledged
    token ran, or nothing is unfinished and the output stopped growing for 3 s, bounded by
    s.crash_recovery_max after the kill."""
    with fresh(s, "crash") as (db, d), serve(s, target, db, d, with_workers=True) as srv:
        acked_file, out_file = d / "acked.txt", d / "tokens.out"
        client = _spawn([str(srv.python), str(PROBES), f"{srv.system}-crash-client", "--dsn", db.dsn, "--port",
                         str(srv.port), "--dir", str(d), "--n", "1000000", "--max-seconds", "300",
                         "--job-seconds", str(CRASH_JOB_SECONDS)],
                        cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=srv.env)
        try:
            deadline = time.monotonic() + 240.0
            while len(_lines(acked_file)) < s.crash_acks:
                if client.poll() is not None:
                    raise RuntimeError(f"crash client exited early:\n{client.communicate()[1][-2000:]}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"fewer than {s.crash_acks} acks in 240 s")
                time.sleep(0.005)
            srv.kill_workers()
            t_kill = time.monotonic()
            ran_at_kill = len(_lines(out_file))
            (d / "stop").touch()
            out, err = client.communicate(timeout=60.0)
        finally:
            _kill_group(client)
            _reap(client)
        if client.returncode != 0:
            raise RuntimeError(f"crash client failed with {client.returncode}:\n{err[-2000:]}")
        srv.start_workers(warm_up=False)  # at once, on the same database
        t_up = time.monotonic()
        want = set(_lines(acked_file))
        deadline, last, stable_since = t_kill + s.crash_recovery_max, -1, time.monotonic()
        while True:
            ran = _lines(out_file)
            if want <= set(ran):
                break
            if len(ran) != last:
                last, stable_since = len(ran), time.monotonic()
            elif time.monotonic() - stable_since > 3.0 and srv.probe("unfinished", timeout=60.0)["unfinished"] == 0:
                break
            if time.monotonic() > deadline:
                break  # counted below as never ran: the peer's recovery did not come in time
            time.sleep(0.05)
        drained = time.monotonic() - t_kill
        end = srv.probe("unfinished", timeout=60.0)
        ran = _lines(out_file)  # again: jobs may have finished while the probe started
        left = end["unfinished"]
        srv.check_alive()
    counts: dict[str, int] = {}
    for tok in ran:
        counts[tok] = counts.get(tok, 0) + 1
    lost = sorted(want - set(counts))
    dup = [t for t, c in counts.items() if c > 1]
    raw = {"acked": len(want), "ran_at_kill": ran_at_kill, "lines_run": len(ran), "lost": len(lost),
           "lost_sample": lost[:20], "run_twice_or_more": len(dup), "dup_sample": dup[:20],
           "kill_to_all_ran_s": drained, "kill_to_restart_s": t_up - t_kill, "unfinished_at_end": left,
           "states_at_end": end["states"],
           "gave_up": not want <= set(ran) and drained > s.crash_recovery_max}
    res.add(scenario, "acknowledged", target, "jobs", len(want), higher_is_better=True, raw=raw)
    res.add(scenario, "acknowledged, never ran", target, "jobs", len(lost), higher_is_better=False)
    res.add(scenario, "ran more than once", target, "jobs", len(dup), higher_is_better=False)
    res.add(scenario, "kill to all ran", target, "s", drained, higher_is_better=False)
    if lost:
        res.notes.append(f"crash, {target}: {len(lost)} acknowledged job(s) had not run {drained:.0f} s after "
                         f"the kill; {left} unfinished in its tables at the end ({end['states']})")


@dataclass
class Scenario:
    name: str
    title: str
    targets: list[str]
    run: Callable[[Settings, Results, str, str], None]


def scenarios(s: Settings) -> list[Scenario]:
    fleet = [queickd_target(k) for k in s.worker_procs] + list(PEERS)
    enq = [QUEICKD_ENQUEUE, *PEERS]
    return [
        Scenario("enqueue-single", f"enqueue {s.enqueue_jobs:,} no-ops, one per request", enq, run_enqueue),
        Scenario("enqueue-batch", f"enqueue {s.enqueue_jobs:,} no-ops, {s.chunk} per request", enq, run_enqueue),
        Scenario("e2e", f"end to end, {s.e2e_jobs:,} one-byte jobs, {s.concurrency} slots", fleet, run_e2e),
        Scenario("idle", f"idle, {s.idle_seconds:g} s after {s.idle_warmup:g} s warm-up", fleet, run_idle),
        Scenario("crash", f"kill -9 of the workers after {s.crash_acks:,} acks",
                 [queickd_target(1), *PEERS], run_crash),
    ]


def select(all_scenarios: list[Scenario], only: str | None) -> list[Scenario]:
    """--only takes names or prefixes, comma-separated: 'enqueue', 'e2e,idle'."""
    if not only:
        return all_scenarios
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    unknown = [w for w in wanted if not any(sc.name.startswith(w) for sc in all_scenarios)]
    if unknown:
        names = ", ".join(sc.name for sc in all_scenarios)
        raise SystemExit(f"bench.pg: unknown scenario(s) {', '.join(unknown)}; choose from: {names}")
    return [sc for sc in all_scenarios if any(sc.name.startswith(w) for w in wanted)]


# --- report -------------------------------------------------------------------------------------------
def _ratio(res: Results, m: Any, peer: str) -> str:
    if not m.target.startswith("queickd") or m.median is None:
        return ""
    p = res.metrics.get((m.scenario, peer, m.label))
    if p is None or p.median is None:
        return "-"
    if not p.median:
        return "0=0" if not m.median else "n/a"  # zero beside zero: no ratio to show
    return f"{m.median / p.median:,.2f}x"


def render(res: Results, order: list[Scenario], info: dict[str, Any], s: Settings,
           skipped: dict[tuple[str, str], str]) -> str:
    lines = [
        f"queickd {info['queickd']} ({info['queickd_path']}) vs {PGQUEUER} and {PROCRASTINATE} on PostgreSQL "
        f"{info['postgres']} ({s.admin_url.rpartition('/')[0]}): {s.rounds} round(s){' (--quick)' if s.quick else ''}; "
        f"{info['nproc']} CPUs, Python {info['python']}, temp dirs on {info['tmp_fs']}",
        f"{s.concurrency} job slots per target: queickd k worker processes share them, the peers run "
        f"{s.peer_processes} worker process(es). Ratios = queickd median / peer median (rates: >1 is faster; "
        "CPU, transactions, time, counts: <1 is less).",
        "",
    ]
    head = ("scenario", "metric", "target", "median", "min–max", "unit", "vs pgqueuer", "vs procrast.")
    rows: list[tuple[str, ...]] = []
    for sc in order:
        labels: list[str] = []
        for m in res.metrics.values():
            if m.scenario == sc.name and m.label not in labels and m.label != "error":
                labels.append(m.label)
        for label in labels:
            for target in sc.targets:
                m = res.metrics.get((sc.name, target, label))
                if m is None or not m.values:
                    continue
                span = f"{_fmt(min(m.values), m.unit)}–{_fmt(max(m.values), m.unit)}"
                rows.append((sc.title, label, target, _fmt(m.median, m.unit), span, m.unit,
                             _ratio(res, m, PGQUEUER), _ratio(res, m, PROCRASTINATE)))
        for target in sc.targets:
            if (sc.name, target) in skipped:
                rows.append((sc.title, "SKIPPED", target, "", "", "", skipped[(sc.name, target)], ""))
                continue
            m = res.metrics.get((sc.name, target, "error"))
            for e in m.errors if m is not None else []:
                first = e.strip().splitlines()[0] if e.strip() else "error"
                rows.append((sc.title, "FAILED", target, "", "", "", first, ""))
        rows.append(())
    widths = [max([len(h)] + [len(r[i]) for r in rows if r and r[1] not in ("FAILED", "SKIPPED")])
              for i, h in enumerate(head)]
    right = {3, 4, 6, 7}

    def fmt_row(r: tuple[str, ...]) -> str:
        if r[1] in ("FAILED", "SKIPPED"):
            return f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[6]}"
        return "  ".join(f"{c:>{w}}" if i in right else f"{c:<{w}}" for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    lines += [fmt_row(head), "-" * (sum(widths) + 2 * (len(widths) - 1))]
    prev = None
    for r in rows:
        if not r:
            lines.append("")
            prev = None
            continue
        lines.append(fmt_row(r if r[0] != prev else ("",) + r[1:]).rstrip())
        prev = r[0]
    if res.notes:
        lines += ["notes:"] + [f"  - {n}" for n in res.notes]
    return "\n".join(lines)


def machine_info(s: Settings) -> dict[str, Any]:
    import platform

    try:
        qv = subprocess.run([sys.executable, "-c", "import queickd; print(queickd.__version__)"], capture_output=True,
                            text=True, timeout=60, cwd=s.tmp_root, env=_queickd_env(s.queickd_path)).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        qv = "?"
    try:
        pg = server_version(s.admin_url)
    except Exception as e:  # reported; every run will fail with the same reason
        pg = f"unreachable ({type(e).__name__}: {e})"
    return {"nproc": os.cpu_count(), "python": platform.python_version(), "queickd": qv,
            "queickd_path": str(s.queickd_path), "postgres": pg, "pgqueuer": PGQUEUER_PINS,
            "procrastinate": PROCRASTINATE_PINS, "tmp_fs": _fs_type(s.tmp_root), "loadavg_start": os.getloadavg()}


def notes(s: Settings, names: set[str]) -> list[str]:
    out = ["Every system acknowledges an enqueue only after PostgreSQL committed it (synchronous_commit as the "
           "server has it), and all three re-run a job whose worker died: queickd after 3 missed 10 s heartbeats, "
           "pgqueuer when a picked job's heartbeat is 30 s old, procrastinate through its documented "
           "retry-stalled-jobs periodic task (every 30 s here, 30 s heartbeat window; see procrastinate_app.py)."]
    if names & {"enqueue-single", "enqueue-batch"}:
        out.append("enqueue: nothing consumes the jobs. queickd's client talks to the daemon (--workers 0), which "
                   "writes to PostgreSQL; the peers' clients write to PostgreSQL themselves (pgqueuer: Queries.enqueue "
                   "on one asyncpg connection; procrastinate: defer_async / batch_defer_async on its psycopg pool). "
                   "CPU is the client's plus the daemon's (the peers have no daemon).")
    if "e2e" in names:
        out.append(f"e2e: jobs append one byte to a file (a no-op with a trace); the clock stops when the file holds N "
                   f"bytes and the system's own tables show no unfinished job (queickd: stats; pgqueuer: rows left in "
                   f"its queue table; procrastinate: todo/doing rows). Enqueued in batches of {s.chunk} while the "
                   "workers run. pgqueuer runs with --max-concurrent-tasks = slots, --batch-size = slots/2 (its rule: "
                   "the cap must be at least twice the batch); procrastinate with --concurrency = slots. Transactions "
                   "per job: commits + rollbacks in pg_stat_database over the run.")
    if "idle" in names:
        out.append("idle: pg_stat_database counts transactions (a statement in autocommit is one), not statements "
                   "(pg_stat_statements needs a server restart to load). Backends report their counts at most every "
                   "second and idle ones within ~10 s, so the window's edges blur by that much. CPU: utime+stime from "
                   "/proc of the target's process groups, and of the server backends connected to the run's "
                   "database, in 10 ms ticks. queickd's sweep (60 s) and procrastinate's retry-stalled task are "
                   "included when they fall inside the window.")
    if "crash" in names:
        out.append(f"crash: jobs work {CRASH_JOB_SECONDS * 1000:g} ms (queickd: time.sleep in a worker thread; the "
                   "peers: asyncio.sleep on their loop), then append their token, so jobs are running at the kill. "
                   "kill -9 of every worker process group (queickd's daemon only takes requests and stays up; "
                   "the peers' clients write to PostgreSQL themselves), then the workers restart on the same database. "
                   "'kill to all ran' (the workers restart at once) is bounded by each system's recovery window for "
                   f"jobs a dead worker held, and by --crash-recovery-max ({s.crash_recovery_max:g} s).")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.pg",
        description="Benchmark queickd's PostgreSQL store (1, 2 and 4 external worker processes) against pgqueuer "
        "and procrastinate on the same local PostgreSQL: enqueue rate, end-to-end jobs/s, idle transactions per "
        "minute, kill -9 of the workers. Targets alternate over the rounds, each on a fresh database.",
        epilog="Scenarios: enqueue-single, enqueue-batch, e2e, idle, crash. The peers' venvs are created on "
        "first use (see the top of bench/pg.py and bench/README.md).",
    )
    p.add_argument("--rounds", type=int, default=None, help="rounds per scenario (default: 3; 1 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1,000 jobs per enqueue run, 2,000 e2e jobs, 5 s + 20 s idle, 300 acks "
                   "before the crash, one round")
    p.add_argument("--only", metavar="SCENARIO", help="only these scenarios (names or prefixes, comma-separated)")
    p.add_argument("--targets", metavar="TEXT",
                   help="only targets whose name contains one of these (comma-separated), e.g. 'pgqueuer,1 worker'")
    p.add_argument("--crash-recovery-max", type=float, default=180.0,
                   help="seconds after the kill -9 that acknowledged jobs get to run (default: 180)")
    p.add_argument("--json", metavar="PATH", help="also write every value of every round as JSON to PATH")
    p.add_argument("--list", action="store_true", help="list the scenarios and their targets, and exit")
    p.add_argument("--pg", default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
                   help="the server's maintenance database; each run creates and drops its own database there "
                   "[env BENCH_PG_URL] (default: %(default)s)")
    p.add_argument("--jobs", type=int, default=None, help="jobs per enqueue run (default: 5,000; 1,000 with --quick)")
    p.add_argument("--chunk", type=int, default=1000, help="jobs per batch request (default: 1000)")
    p.add_argument("--e2e-jobs", type=int, default=None, help="jobs per e2e run (default: 5,000; 2,000 with --quick)")
    p.add_argument("--concurrency", type=int, default=4, help="job slots per target (default: 4)")
    p.add_argument("--worker-procs", default="1,2,4",
                   help="queickd worker process counts to run, comma-separated (default: 1,2,4)")
    p.add_argument("--peer-processes", type=int, default=1,
                   help="worker processes per peer, sharing --concurrency (default: 1; pgqueuer needs >= 2 slots "
                   "per process)")
    p.add_argument("--idle-warmup", type=float, default=None, help="seconds before idle is measured (default: 30; 5 "
                   "with --quick)")
    p.add_argument("--idle-seconds", type=float, default=None, help="idle window in seconds (default: 60; 20 with "
                   "--quick)")
    p.add_argument("--crash-acks", type=int, default=None, help="acks before kill -9 (default: 1,000; 300 with --quick)")
    p.add_argument("--pgqueuer-venv", type=Path,
                   default=Path(os.environ.get("BENCH_PGQUEUER_VENV", CACHE_DIR / "pgqueuer-venv")),
                   help="virtualenv with pgqueuer 1.6.0 + asyncpg, created if missing [env BENCH_PGQUEUER_VENV]")
    p.add_argument("--procrastinate-venv", type=Path,
                   default=Path(os.environ.get("BENCH_PROCRASTINATE_VENV", CACHE_DIR / "procrastinate-venv")),
                   help="virtualenv with procrastinate 3.10.0 + psycopg, created if missing "
                   "[env BENCH_PROCRASTINATE_VENV]")
    p.add_argument("--queickd-path", type=Path, default=os.environ.get("BENCH_QUEICKD_PATH"),
                   help="directory holding the queickd package to benchmark, passed to every queickd process "
                   "as PYTHONPATH [env BENCH_QUEICKD_PATH] (default: the first $PYTHONPATH entry holding one, "
                   "else where this Python imports queickd from)")
    p.add_argument("--tmp-dir", type=Path, default=Path(tempfile.gettempdir()),
                   help="where the per-run temp dirs go (default: %(default)s)")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    rounds = a.rounds if a.rounds is not None else (1 if a.quick else 3)
    try:
        procs = sorted({int(x) for x in a.worker_procs.split(",") if x.strip()})
    except ValueError:
        raise SystemExit("bench.pg: --worker-procs takes numbers, e.g. 1,2,4") from None
    if rounds < 1 or a.concurrency < 1 or not procs or min(procs) < 1 or max(procs) > a.concurrency:
        raise SystemExit("bench.pg: --rounds and --concurrency must be positive; --worker-procs between 1 and "
                         "--concurrency")
    if not 1 <= a.peer_processes <= a.concurrency or not 1 <= a.chunk <= 10_000:
        raise SystemExit("bench.pg: --peer-processes between 1 and --concurrency, --chunk 1-10000")
    s = Settings(
        rounds=rounds, quick=a.quick, admin_url=a.pg, tmp_root=a.tmp_dir.resolve(),
        enqueue_jobs=a.jobs or (1_000 if a.quick else 5_000), chunk=a.chunk,
        e2e_jobs=a.e2e_jobs or (2_000 if a.quick else 5_000), concurrency=a.concurrency, worker_procs=procs,
        peer_processes=a.peer_processes,
        idle_warmup=a.idle_warmup if a.idle_warmup is not None else (5.0 if a.quick else 30.0),
        idle_seconds=a.idle_seconds or (20.0 if a.quick else 60.0),
        crash_acks=a.crash_acks or (300 if a.quick else 1_000), crash_recovery_max=a.crash_recovery_max,
        pgqueuer_venv=a.pgqueuer_venv.resolve(), procrastinate_venv=a.procrastinate_venv.resolve(),
    )
    order = select(scenarios(s), a.only)
    if a.targets:
        wanted = [w.strip() for w in a.targets.split(",") if w.strip()]
        for sc in order:
            sc.targets = [t for t in sc.targets if any(w in t for w in wanted)]
        order = [sc for sc in order if sc.targets]
    if a.list:
        print_scenarios(scenarios(s))
        return 0
    s.tmp_root.mkdir(parents=True, exist_ok=True)
    stop_on_sigterm()
    res = Results()
    skipped: dict[tuple[str, str], str] = {}
    s.queickd_path = a.queickd_path.resolve() if a.queickd_path else default_queickd_path()
    s.queickd_skip = check_queickd(s.queickd_path, s.tmp_root)
    if s.queickd_skip:
        log(f"queickd targets skipped: {s.queickd_skip}")
    info = machine_info(s)
    try:
        for peer, venv, pins in ((PGQUEUER, s.pgqueuer_venv, PGQUEUER_PINS),
                                 (PROCRASTINATE, s.procrastinate_venv, PROCRASTINATE_PINS)):
            try:
                s.pythons[peer] = ensure_venv(venv, pins)
            except Exception as e:  # no registry, no venv module: that peer's rows fail
                s.venv_errors[peer] = f"{type(e).__name__}: {e}"
                log(f"cannot prepare the {peer} venv ({s.venv_errors[peer]}); its runs will fail")
        run_rounds(order, s, res, skipped)
    except KeyboardInterrupt:
        log("interrupted; reporting what was measured")
        res.notes.append("interrupted before the end")
    finally:
        kill_all()
    info["loadavg_end"] = os.getloadavg()
    res.notes += notes(s, {sc.name for sc in order})
    print(render(res, order, info, s, skipped), flush=True)
    if a.json:
        doc = {
            "machine": info,
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(s).items() if k != "pythons"},
            "scenarios": [{"name": sc.name, "title": sc.title, "targets": sc.targets} for sc in order],
            "skipped": [{"scenario": k[0], "target": k[1], "reason": v} for k, v in skipped.items()],
            "results": [
                {"scenario": m.scenario, "metric": m.label, "target": m.target, "unit": m.unit, "values": m.values,
                 "median": m.median, "min": min(m.values) if m.values else None,
                 "max": max(m.values) if m.values else None, "errors": m.errors, "rounds": m.rounds}
                for m in res.metrics.values()
            ],
            "notes": res.notes,
        }
        Path(a.json).write_text(json.dumps(doc, indent=2, default=str) + "\n")
        log(f"wrote {a.json}")
    return 1 if res.has_errors() else 0


if __name__ == "__main__":
    sys.exit(main())
