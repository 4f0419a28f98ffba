"""bench.pg's processes: a probe run in a fresh process, and a target (queickd's daemon and
workers, or a peer's schema and workers) served on a fresh database, killed on leaving."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.pgsetup import (
    DIRECT_PROBES,
    PGQUEUER,
    PGQUEUER_APP,
    PROBES,
    PROCRASTINATE,
    PROCRASTINATE_APP,
    QUEICKD_ENQUEUE,
    WORKER_UP,
    Database,
    Settings,
    _queickd_env,
    split,
)
from bench.processes import (
    BENCH_DIR,
    JOBS_FILE,
    LISTENING,
    LineWaiter,
    _clean_env,
    _kill_group,
    _reap,
    _spawn,
    group_usage,
)
from bench.run import TargetSkippedError


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
    client: str = ""  # the probes' client when it is not the system's own (queickd.pg's)

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
        return run_probe(self.python, f"{self.client or self.system}-{what}", base + list(args), self.d, self.env,
                         timeout)

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
    schema installed by their own CLI), and its workers if with_workers; killed on leaving.
    The queickd.pg targets get the daemon too: it migrates the schema and publishes the
    rules their enqueues apply, as in a deployment; their probes write past it."""
    if target in (QUEICKD_ENQUEUE, *DIRECT_PROBES) or target.startswith("queickd pg,"):
        if s.queickd_skip:
            raise TargetSkippedError(s.queickd_skip)
        srv = Served(target, "queickd", s, db, d, client=DIRECT_PROBES.get(target, ""))
        k = int(target.split(", ")[1].split()[0]) if target.startswith("queickd pg,") else 0
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
    if srv.system != "queickd":
        # The peers import the jobs from their working directory; queickd from --app-dir
        # (a copy in its working directory would shadow that, which it refuses).
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
