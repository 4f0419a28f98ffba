"""The peers: Queick 1.2.1's server and huey 3.5.4's consumer (started in their own
process groups), huey's job module, and the virtualenvs each peer lives in (created on
first use, reused while they hold the pinned version), Celery's too (bench/workflows.py
runs its worker). The target names live here too.
It owns no scenario and no report.
"""

from __future__ import annotations

import contextlib
import pickle
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from bench.processes import (
    LineWaiter,
    _clean_env,
    _kill_group,
    _ProcessGroup,
    _reap,
    _spawn,
    copy_job_modules,
    group_pids,
    log,
    wait_port_free,
)

QUEICK_VERSION = "1.2.1"
QUEICK_PORT = 9999  # hard-coded in Queick 1.2.1 (queick/constants.py)
QUEICKD_SQLITE = "queickd sqlite/full"
QUEICKD_MEMORY = "queickd memory"
# Acks after the WAL write, without waiting for its fsync: survives kill -9, not a power cut.
# Context for the one-at-a-time rows, where a durable ack costs one fsync'd commit.
QUEICKD_NORMAL = "queickd sqlite/normal"
QUEICKD_TARGETS = {QUEICKD_SQLITE: ("sqlite", "full"), QUEICKD_NORMAL: ("sqlite", "normal"),
                   QUEICKD_MEMORY: ("memory", "full")}
QUEICK = f"Queick {QUEICK_VERSION}"
HUEY_VERSION = "3.5.4"
HUEY = f"huey {HUEY_VERSION} SqliteHuey"
HUEY_STARTED = re.compile(r"Huey consumer started")
# Celery with the Redis client (its result backend in bench/workflows.py); the AMQP client
# for RabbitMQ, its default broker, comes with Celery itself (kombu, amqp).
CELERY_VERSION = "5.7.0"
CELERY_EXTRAS = "[redis]"


def _queick_job(func: str) -> bytes:
    """The pickled dict Queick 1.2.1's JobQueue.enqueue sends (queick/job_queue.py)."""
    return pickle.dumps({
        "func_name": func, "args": (), "retry": False, "retry_interval": 10, "retry_type": "exponential",
        "max_retry_interval": 600, "retry_on_network_available": False, "max_workers": 10,
    })


class QueickServer:
    """Queick 1.2.1's `queick` in data_dir (it imports jobs from its working directory).

    It forks a receiver process that owns 127.0.0.1:9999, so the whole process group is
    measured and killed. Readiness: Queick prints nothing useful, so connect to 9999 in a
    short bounded retry loop. The probe sends one real no-op job: a connection closed
    without data would make Queick's receiver leave its accept loop for good
    (job_receiver.py: `if not data_bytes: break`).
    """

    def __init__(self, venv: Path, data_dir: Path) -> None:
        self.venv = venv
        self.data_dir = data_dir
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> QueickServer:
        # 75 s: after a kill -9 the kernel may hold 127.0.0.1:9999 in TIME_WAIT for 60 s, and
        # Queick binds without SO_REUSEADDR
        wait_port_free(QUEICK_PORT, timeout=75.0)
        copy_job_modules(self.data_dir, self.venv / "bin" / "python")
        with open(self.data_dir / "queick.log", "wb") as logf:
            self.proc = _spawn([str(self.venv / "bin" / "queick")], cwd=self.data_dir, stdout=logf,
                               stderr=subprocess.STDOUT, env=_clean_env())
        try:
            self._wait_ready(timeout=30.0)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        payload = _queick_job("benchjobs.noop")
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Queick exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", QUEICK_PORT), timeout=5.0) as s:
                    s.sendall(payload)
                    reply = pickle.loads(s.recv(1024))
                if not isinstance(reply, dict) or not reply.get("success"):
                    raise RuntimeError(f"Queick refused the readiness job: {reply}")
                return
            except (ConnectionRefusedError, ConnectionResetError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"Queick not accepting on {QUEICK_PORT} after {timeout} s") from None
                time.sleep(0.02)

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        pgid = self.proc.pid
        _kill_group(self.proc)
        _reap(self.proc)
        deadline = time.monotonic() + 10.0
        while group_pids(pgid) and time.monotonic() < deadline:  # the forked receiver
            time.sleep(0.02)
        try:
            wait_port_free(QUEICK_PORT, timeout=75.0)
        except RuntimeError:  # the next start waits (and fails) if it is still taken
            log(f"127.0.0.1:{QUEICK_PORT} still taken 75 s after Queick stopped")

    def pids(self) -> list[int]:
        assert self.proc is not None
        return group_pids(self.proc.pid)

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join((self.data_dir / "queick.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def job_errors(self) -> int:
        try:
            return (self.data_dir / "queick.log").read_text(errors="replace").count("ERROR")
        except OSError:
            return 0


HUEY_MODULE = '''"""Written by bench/peers.py: the SqliteHuey instance and the bench tasks."""
from huey import SqliteHuey

import benchjobs

# fsync=True: synchronous=FULL on every connection (commits survive power loss, like queickd
# --durability full). This is also SQLite's usual compiled-in default, which huey keeps.
huey = SqliteHuey("bench", filename={db!r}, fsync=True)


@huey.task()
def noop():
    benchjobs.noop()


@huey.task()
def append_byte(path):
    benchjobs.append_byte(path)


@huey.task()
def append_line(path, line):
    benchjobs.append_line(path, line)


@huey.task()
def record_latency(path, sent_at):
    benchjobs.record_latency(path, sent_at)
'''


def write_huey_app(data_dir: Path, python: Path | str) -> Path:
    """Write hueyjobs.py (the SqliteHuey instance on data_dir/huey.db and its tasks) and a
    copy of benchjobs.py into data_dir, where huey's consumer and client probes import them,
    byte-compiled under huey's `python`. Returns the database path."""
    db_path = data_dir / "huey.db"
    (data_dir / "hueyjobs.py").write_text(HUEY_MODULE.format(db=str(db_path)))
    copy_job_modules(data_dir, python)
    return db_path


def huey_table_counts(db_path: Path) -> dict[str, int]:
    """Rows in huey's queue table (`task`: enqueued, not yet dequeued by a worker) and in its
    `schedule` table (future tasks a worker dequeued and set aside)."""
    with contextlib.closing(sqlite3.connect(db_path, timeout=10.0)) as c:
        return {t: c.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("task", "schedule")}


class HueyConsumer(_ProcessGroup):
    """huey 3.5.4's consumer, `VENV/bin/huey_consumer hueyjobs.huey -w 4 -k thread`, in
    data_dir, which holds the files write_huey_app writes. huey has no server: clients
    insert tasks into the SQLite file themselves and the consumer's workers poll it.
    Readiness: the consumer's `Huey consumer started` log line."""

    def __init__(self, venv: Path, data_dir: Path, workers: int = 4) -> None:
        self.venv = venv
        self.data_dir = data_dir
        self.db_path = data_dir / "huey.db"
        self.workers = workers
        self.proc: subprocess.Popen | None = None
        self.out: LineWaiter | None = None

    def __enter__(self) -> HueyConsumer:
        self.db_path = write_huey_app(self.data_dir, self.venv / "bin" / "python")
        cmd = [str(self.venv / "bin" / "huey_consumer"), "hueyjobs.huey", "-w", str(self.workers), "-k", "thread"]
        self.proc = _spawn(cmd, cwd=self.data_dir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           env=_clean_env())
        try:
            self.out = LineWaiter(self.proc)
            self.out.wait_for(HUEY_STARTED, timeout=30.0)
        except BaseException:
            self.__exit__()
            raise
        return self

    def pending(self) -> int:
        """Tasks still in huey's queue table (a task leaves it when a worker dequeues it)."""
        return huey_table_counts(self.db_path)["task"]

    def stop(self, timeout: float = 60.0) -> float:
        """Graceful stop (SIGINT: workers finish, the storage connection is closed). Returns
        seconds taken."""
        assert self.proc is not None
        t0 = time.perf_counter()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"huey's consumer did not stop within {timeout} s") from None
        return time.perf_counter() - t0


# --- the peer's virtualenv -------------------------------------------------------------------
def _ensure_venv(venv: Path, package: str, version: str, script: str, extras: str = "",
                 imports: tuple[str, ...] = ()) -> Path:
    """Create (or reuse) a virtualenv holding package[extras]==version (with its console
    script `script`, and the modules `imports` its extras bring); returns its python."""
    py = venv / "bin" / "python"
    check = [str(py), "-c", f"import importlib.metadata as m; [__import__(x) for x in {imports!r}]; "
             f"print(m.version({package!r}))"]
    if py.exists() and (venv / "bin" / script).exists():
        r = subprocess.run(check, capture_output=True, text=True, timeout=60, env=_clean_env())
        if r.returncode == 0 and r.stdout.strip() == version:
            return py
        log(f"{venv} does not hold {package}{extras} {version}; recreating it")
        shutil.rmtree(venv)
    log(f"creating the venv {venv} ({package}{extras}=={version})")
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    f"{package}{extras}=={version}"], check=True, timeout=600, env=_clean_env())
    r = subprocess.run(check, capture_output=True, text=True, timeout=60, env=_clean_env())
    if r.returncode != 0 or r.stdout.strip() != version:
        raise RuntimeError(f"{package}{extras} {version} did not install into {venv}: {r.stderr}")
    return py


def ensure_peer_venv(venv: Path) -> Path:
    """Create (or reuse) a virtualenv holding Queick 1.2.1; returns its python."""
    return _ensure_venv(venv, "queick", QUEICK_VERSION, "queick")


def ensure_huey_venv(venv: Path) -> Path:
    """Create (or reuse) a virtualenv holding huey 3.5.4; returns its python."""
    return _ensure_venv(venv, "huey", HUEY_VERSION, "huey_consumer")


def ensure_celery_venv(venv: Path) -> Path:
    """Create (or reuse) a virtualenv holding celery[redis] 5.7.0 (CELERY_VERSION); returns its python."""
    return _ensure_venv(venv, "celery", CELERY_VERSION, "celery", extras=CELERY_EXTRAS, imports=("redis",))
