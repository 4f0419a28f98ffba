"""queickd against the original Queick 1.2.1 and huey 3.5.4 (SqliteHuey): enqueue rate,
memory and disk per queued job, end-to-end rate, enqueue->start latency, idle cost and
kill -9 recovery, and the machine's raw limits for context.

    python -m bench.run                    # 3 rounds of everything (the 1M-job run takes minutes)
    python -m bench.run --quick            # a fast smoke run: fewer jobs, one round, no 1M run
    python -m bench.run --only enqueue-single,raw --json results.json
    python bench/run.py --help

The peer: Queick 1.2.1 (PyPI `queick==1.2.1`, stdlib only, in-memory) cannot be installed
next to queickd, because both install a console script named `queick`. So it lives in a
virtualenv of its own, which this script creates on first use and reuses afterwards:

    python3 -m venv VENV && VENV/bin/pip install queick==1.2.1

VENV is --peer-venv, else $BENCH_QUEICK_VENV, else bench/.bench-cache/queick-venv (ignored
by git). An existing venv is reused when its `queick` package reports version 1.2.1. The
Queick server is started as VENV/bin/queick (an absolute path, never via PATH) and its
client runs under VENV/bin/python; queickd runs as `python -m queickd` under this Python.
huey 3.5.4 gets its own virtualenv the same way (--huey-venv, else $BENCH_HUEY_VENV, else
bench/.bench-cache/huey-venv); see HueyConsumer.

Every target runs in a fresh process with a fresh temp data dir; targets alternate
(A B C A B C ...) over the rounds. Only loopback addresses are used. Every process this
script starts is in its own process group and is killed at the end, even on error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import platform
import queue
import re
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
CACHE_DIR = BENCH_DIR / ".bench-cache"
PROBES = BENCH_DIR / "probes.py"
JOBS_FILE = BENCH_DIR / "benchjobs.py"

QUEICK_VERSION = "1.2.1"
QUEICK_PORT = 9999  # hard-coded in Queick 1.2.1 (queick/constants.py)
LISTENING = re.compile(r"listening on (\S+):(\d+)")
FAR_FUTURE = 10**7  # seconds: jobs that stay scheduled for the whole run
CLK_TCK = os.sysconf("SC_CLK_TCK")

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


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- processes ---------------------------------------------------------------------------------
_LIVE: list[subprocess.Popen] = []  # started and not yet reaped; killed by kill_all()


def _clean_env(extra_path: bool = False) -> dict[str, str]:
    """This environment minus anything that would change a daemon's config or a venv's
    imports (QUEICKD_*, systemd's variables, PYTHONPATH/PYTHONHOME)."""
    drop = ("JOURNAL_STREAM", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "PYTHONPATH", "PYTHONHOME")
    return {k: v for k, v in os.environ.items() if not k.startswith("QUEICKD_") and k not in drop}


def _spawn(cmd: list[str], **kw: Any) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True, **kw)
    _LIVE.append(proc)
    return proc


def _kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Signal the process group this script gave `proc` (it and whatever it forked). Once
    `proc` is reaped, only while members of its group live on: the id cannot have been
    reused then, so the signal still reaches only what this script started."""
    if proc.poll() is not None and not group_pids(proc.pid):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _reap(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.wait(10.0)
    if proc in _LIVE:
        _LIVE.remove(proc)


def kill_all() -> None:
    """Kill every process group this script started and has not reaped yet."""
    for proc in list(_LIVE):
        _kill_group(proc)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10.0)
        _LIVE.remove(proc)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # fields from 3 (state) on


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group pgid."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            f = _stat_fields(int(name))
            if f and f[0] != "Z" and int(f[2]) == pgid:
                out.append(int(name))
    return sorted(out)


def proc_mem(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    f = _stat_fields(pid)
    return 0.0 if f is None else (int(f[11]) + int(f[12])) / CLK_TCK


def proc_ctx_switches(pid: int) -> int:
    """Voluntary + involuntary context switches of every thread of a process, so far."""
    total = 0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        total += int(line.split(":")[1])
    return total


def group_usage(pgid: int) -> dict[int, tuple[float, int]]:
    """(CPU seconds, context switches) of every live process in a process group."""
    return {p: (proc_cpu(p), proc_ctx_switches(p)) for p in group_pids(pgid)}


class LineWaiter:
    """Drains a child's stderr in a thread (so it never blocks on a full pipe) and waits
    for a line matching a pattern."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:  # type: ignore[union-attr]
            if len(self.lines) < 10_000:
                self.lines.append(line)
            self._q.put(line)
        self._q.put(None)

    def wait_for(self, rx: re.Pattern[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no line matching {rx.pattern!r} in {timeout} s:\n{self.tail()}")
            try:
                line = self._q.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"process exited before logging {rx.pattern!r}:\n{self.tail()}")
            if m := rx.search(line):
                return m

    def tail(self, n: int = 30) -> str:
        return "".join(self.lines[-n:])


class _ProcessGroup:
    """A target started with _spawn in its own process group; leaving the `with` kills it."""

    proc: subprocess.Popen | None = None

    def pids(self) -> list[int]:
        assert self.proc is not None
        return group_pids(self.proc.pid)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            _kill_group(self.proc)
            _reap(self.proc)


class QueickdDaemon(_ProcessGroup):
    """`python -m queickd run` on a free loopback port, with a store in data_dir."""

    def __init__(self, store: str, data_dir: Path, workers: int, durability: str = "full") -> None:
        self.data_dir = data_dir
        self.db_path = data_dir / "queue.db"
        self.url = f"sqlite:///{self.db_path}" if store == "sqlite" else "memory://"
        self.workers = workers
        self.durability = durability
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.out: LineWaiter | None = None

    def __enter__(self) -> QueickdDaemon:
        cmd = [sys.executable, "-m", "queickd", "run", "--store", self.url, "--durability", self.durability,
               "--bind", "127.0.0.1", "--port", "0", "--workers", str(self.workers),
               "--app-dir", str(BENCH_DIR), "--log-level", "info"]
        self.proc = _spawn(cmd, cwd=self.data_dir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, env=_clean_env())
        try:
            self.out = LineWaiter(self.proc)
            m = self.out.wait_for(LISTENING, timeout=30.0)
            if m.group(1) != "127.0.0.1":
                raise RuntimeError(f"queickd listens on {m.group(1)}, not loopback")
            self.port = int(m.group(2))
        except BaseException:
            self.__exit__()
            raise
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout: float = 120.0) -> float:
        """Graceful stop (SIGTERM: commit, checkpoint, close). Returns seconds taken."""
        assert self.proc is not None
        t0 = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"queickd did not stop within {timeout} s") from None
        if rc != 0:
            raise RuntimeError(f"queickd exited with {rc} on SIGTERM:\n{self.out.tail() if self.out else ''}")
        return time.perf_counter() - t0

    def store_bytes(self) -> dict[str, int]:
        return sqlite_files(self.db_path)


def port_free(port: int) -> bool:
    """Whether a listener could bind 127.0.0.1:port the way Queick does (no SO_REUSEADDR)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def wait_port_free(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not port_free(port):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"127.0.0.1:{port} is in use (a queickd on its default port, or a Queick left "
                "running?); Queick 1.2.1 can only listen there. Stop it and run again."
            )
        time.sleep(0.05)


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
        shutil.copy(JOBS_FILE, self.data_dir / "benchjobs.py")
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


HUEY_MODULE = '''"""Written by bench/run.py: the SqliteHuey instance and the bench tasks."""
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


def write_huey_app(data_dir: Path) -> Path:
    """Write hueyjobs.py (the SqliteHuey instance on data_dir/huey.db and its tasks) and a
    copy of benchjobs.py into data_dir, where huey's consumer and client probes import them.
    Returns the database path."""
    db_path = data_dir / "huey.db"
    shutil.copy(JOBS_FILE, data_dir / "benchjobs.py")
    (data_dir / "hueyjobs.py").write_text(HUEY_MODULE.format(db=str(db_path)))
    return db_path


def huey_table_counts(db_path: Path) -> dict[str, int]:
    """Rows in huey's queue table (`task`: enqueued, not yet dequeued by a worker) and in its
    `schedule` table (future tasks a worker dequeued and set aside)."""
    with contextlib.closing(sqlite3.connect(db_path, timeout=10.0)) as c:
        return {t: c.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("task", "schedule")}


def sqlite_files(db_path: Path) -> dict[str, int]:
    """Sizes of a SQLite database and its -wal and -shm files (0 when absent), in bytes."""
    out = {}
    for suffix in ("", "-wal", "-shm"):
        p = Path(f"{db_path}{suffix}")
        out["db" + suffix] = p.stat().st_size if p.exists() else 0
    return out


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
        self.db_path = write_huey_app(self.data_dir)
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


def run_probe(python: str | Path, kind: str, *args: str, cwd: Path | None = None,
              timeout: float = 600.0, progress: bool = False) -> dict[str, Any]:
    """Run one measurement in a fresh process; returns its JSON result. With progress=True
    the probe's stderr (its progress lines, and a traceback on failure) goes straight to
    this script's stderr instead of into the error message."""
    cmd = [str(python), str(PROBES), kind, *args]
    proc = _spawn(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=None if progress else subprocess.PIPE, text=True,
                  env=_clean_env())
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"probe {kind} took over {timeout:.0f} s") from None
    finally:
        _kill_group(proc)
        _reap(proc)
    err = err or ""
    if proc.returncode != 0:
        raise RuntimeError(f"probe {kind} failed with {proc.returncode}:\n{(out + err)[-3000:]}")
    lines = [line for line in out.splitlines() if line.strip()]
    if not lines:
        raise RuntimeError(f"probe {kind} printed no result:\n{err[-3000:]}")
    return json.loads(lines[-1])


# --- the peer's virtualenv -------------------------------------------------------------------
def _ensure_venv(venv: Path, package: str, version: str, script: str) -> Path:
    """Create (or reuse) a virtualenv holding package==version (with its console script
    `script`); returns its python."""
    py = venv / "bin" / "python"
    check = [str(py), "-c", f"import importlib.metadata as m; print(m.version({package!r}))"]
    if py.exists() and (venv / "bin" / script).exists():
        r = subprocess.run(check, capture_output=True, text=True, timeout=60, env=_clean_env())
        if r.returncode == 0 and r.stdout.strip() == version:
            return py
        log(f"{venv} does not hold {package} {version}; recreating it")
        shutil.rmtree(venv)
    log(f"creating the venv {venv} ({package}=={version})")
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    f"{package}=={version}"], check=True, timeout=600, env=_clean_env())
    r = subprocess.run(check, capture_output=True, text=True, timeout=60, env=_clean_env())
    if r.returncode != 0 or r.stdout.strip() != version:
        raise RuntimeError(f"{package} {version} did not install into {venv}: {r.stderr}")
    return py


def ensure_peer_venv(venv: Path) -> Path:
    """Create (or reuse) a virtualenv holding Queick 1.2.1; returns its python."""
    return _ensure_venv(venv, "queick", QUEICK_VERSION, "queick")


def ensure_huey_venv(venv: Path) -> Path:
    """Create (or reuse) a virtualenv holding huey 3.5.4; returns its python."""
    return _ensure_venv(venv, "huey", HUEY_VERSION, "huey_consumer")


# --- results -----------------------------------------------------------------------------------
@dataclass
class Metric:
    scenario: str  # e.g. "enqueue-single"
    label: str  # what the table shows in its scenario column
    target: str
    unit: str
    higher_is_better: bool
    peer: tuple[str, str, str] | None = None  # (scenario, target, label) this is compared to
    values: list[float] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None


class Results:
    def __init__(self) -> None:
        self.metrics: dict[tuple[str, str, str], Metric] = {}
        self.notes: list[str] = []

    def add(self, scenario: str, label: str, target: str, unit: str, value: float, *,
            higher_is_better: bool, peer: tuple[str, str, str] | None = None,
            raw: dict[str, Any] | None = None) -> None:
        key = (scenario, target, label)
        m = self.metrics.get(key)
        if m is None:
            m = self.metrics[key] = Metric(scenario, label, target, unit, higher_is_better, peer)
        m.values.append(value)
        if raw is not None:
            m.rounds.append(raw)

    def error(self, scenario: str, target: str, message: str) -> None:
        key = (scenario, target, "error")
        m = self.metrics.get(key)
        if m is None:
            m = self.metrics[key] = Metric(scenario, "error", target, "", True)
        m.errors.append(message)

    def ratio(self, m: Metric) -> float | None:
        if m.peer is None or m.median is None:
            return None
        p = self.metrics.get(m.peer)
        if p is None or not p.median:
            return None
        return m.median / p.median

    def has_errors(self) -> bool:
        return any(m.errors for m in self.metrics.values())


# --- scenarios -----------------------------------------------------------------------------------
@dataclass
class Settings:
    rounds: int
    quick: bool
    enqueue_jobs: int
    chunk: int
    memory_sizes: list[int]
    queick_memory_max: int
    raw_seconds: float
    tmp_root: Path
    venv: Path
    e2e_jobs: int = 5_000
    latency_samples: int = 100
    idle_warmup: float = 90.0
    idle_seconds: float = 30.0
    crash_acks: int = 2_000
    huey_venv: Path = CACHE_DIR / "huey-venv"
    # memory-* runs with more jobs leave huey out: its fill is one fsync'd commit per task and its
    # consumer then moves each task to its schedule table, 4-6 minutes per 100,000 here
    huey_memory_max: int = 100_000
    peer_python: Path | None = None
    peer_error: str | None = None
    huey_python: Path | None = None
    huey_error: str | None = None

    def peer(self) -> Path:
        if self.peer_python is None:
            raise RuntimeError(f"no Queick {QUEICK_VERSION} venv: {self.peer_error}")
        return self.peer_python

    def huey(self) -> Path:
        if self.huey_python is None:
            raise RuntimeError(f"no huey {HUEY_VERSION} venv: {self.huey_error}")
        return self.huey_python


def _fresh_dir(s: Settings, name: str) -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix=f"queickd-bench-{name}-", dir=s.tmp_root)


def _enqueue_metrics(res: Results, scenario: str, target: str, n: int, probe: dict[str, Any],
                     server_cpu: float | None) -> None:
    """server_cpu is None for huey: it has no server, and its consumer does not run while its
    enqueues are measured."""

    def peer(label: str) -> tuple[str, str, str] | None:
        return ("enqueue-single", QUEICK, label) if target not in (QUEICK, HUEY) else None

    res.add(scenario, "enqueue rate", target, "jobs/s", probe["rate"], higher_is_better=True,
            peer=peer("enqueue rate"), raw={**probe, "server_cpu_s": server_cpu})
    if server_cpu is not None:
        res.add(scenario, "server CPU per job", target, "µs", server_cpu / n * 1e6, higher_is_better=False,
                peer=peer("server CPU per job"))
    if "client_cpu_s" in probe:
        res.add(scenario, "client CPU per job", target, "µs", probe["client_cpu_s"] / n * 1e6,
                higher_is_better=False, peer=peer("client CPU per job"))


def run_enqueue(s: Settings, res: Results, scenario: str, target: str) -> None:
    n = s.enqueue_jobs
    timeout = 60.0 + n / 200  # far above the slowest expected rate, still bounded
    if target == QUEICK:
        peer_python = s.peer()
        with _fresh_dir(s, "queick") as d, QueickServer(s.venv, Path(d)) as srv:
            pids = srv.pids()
            cpu0 = sum(proc_cpu(p) for p in pids)
            probe = run_probe(peer_python, "queick-enqueue", "--n", str(n), cwd=Path(d), timeout=timeout)
            cpu = sum(proc_cpu(p) for p in srv.pids()) - cpu0
            probe["job_errors_logged"] = srv.job_errors()
        _enqueue_metrics(res, scenario, target, n, probe, cpu)
        return
    if target == HUEY:
        # No consumer: like queickd's --workers 0, nothing dequeues while enqueues are measured.
        huey_python = s.huey()
        with _fresh_dir(s, "huey") as d:
            write_huey_app(Path(d))
            probe = run_probe(huey_python, "huey-enqueue", "--n", str(n), "--dir", d, cwd=Path(d), timeout=timeout)
        _enqueue_metrics(res, scenario, target, n, probe, None)
        return
    store, durability = QUEICKD_TARGETS[target]
    mode = scenario.removeprefix("enqueue-")
    with _fresh_dir(s, store) as d, QueickdDaemon(store, Path(d), workers=0, durability=durability) as daemon:
        cpu0 = proc_cpu(daemon.pid)
        probe = run_probe(sys.executable, "queickd-enqueue", "--port", str(daemon.port), "--mode", mode,
                          "--n", str(n), "--chunk", str(s.chunk), timeout=timeout)
        cpu = proc_cpu(daemon.pid) - cpu0
    _enqueue_metrics(res, scenario, target, n, probe, cpu)


def run_memory(s: Settings, res: Results, scenario: str, target: str, n: int) -> None:
    mib = 1024 * 1024

    def peer_of(label: str) -> tuple[str, str, str] | None:
        return (scenario, QUEICK, label) if target not in (QUEICK, HUEY) and n <= s.queick_memory_max else None

    if target == QUEICK:
        peer_python = s.peer()
        with _fresh_dir(s, "queick") as d, QueickServer(s.venv, Path(d)) as srv:
            before = {p: proc_mem(p) for p in srv.pids()}
            probe = run_probe(peer_python, "queick-fill", "--n", str(n), "--delay", str(FAR_FUTURE),
                              "--max-seconds", "900", cwd=Path(d), timeout=960.0)
            after = {p: proc_mem(p) for p in srv.pids()}
        rss0 = sum(v["VmRSS"] for v in before.values())
        rss1 = sum(v["VmRSS"] for v in after.values())
        hwm1 = sum(v["VmHWM"] for v in after.values())
        raw = {**probe, "before": before, "after": after, "processes": len(after)}
        store_per_job = None
    elif target == HUEY:
        rss0, rss1, hwm1, probe, raw = _huey_memory(s, res, scenario, n)
    else:
        with _fresh_dir(s, "sqlite") as d, QueickdDaemon("sqlite", Path(d), workers=4) as daemon:
            m0 = proc_mem(daemon.pid)
            probe = run_probe(sys.executable, "queickd-fill", "--port", str(daemon.port), "--n", str(n),
                              "--chunk", str(s.chunk), "--delay", str(FAR_FUTURE), timeout=120.0 + n / 1000)
            m1 = proc_mem(daemon.pid)
            files = daemon.store_bytes()
            stop_s = daemon.stop()
            files_stopped = daemon.store_bytes()
        rss0, rss1, hwm1 = m0["VmRSS"], m1["VmRSS"], m1["VmHWM"]
        store_per_job = (files["db"] + files["db-wal"]) / n
        raw = {**probe, "before": m0, "after": m1, "files": files, "files_after_stop": files_stopped,
               "stop_seconds": stop_s}
        res.add(scenario, "store (db+wal) per job", target, "bytes", store_per_job, higher_is_better=False)
        res.add(scenario, "store per job, after clean stop", target, "bytes", files_stopped["db"] / n,
                higher_is_better=False)
    res.add(scenario, "RSS before", target, "MiB", rss0 / mib, higher_is_better=False, peer=peer_of("RSS before"))
    res.add(scenario, "RSS after", target, "MiB", rss1 / mib, higher_is_better=False, peer=peer_of("RSS after"))
    res.add(scenario, "VmHWM after", target, "MiB", hwm1 / mib, higher_is_better=False,
            peer=peer_of("VmHWM after"))
    res.add(scenario, "RSS growth per job", target, "bytes", (rss1 - rss0) / n, higher_is_better=False,
            peer=peer_of("RSS growth per job"), raw=raw)
    res.add(scenario, "fill rate", target, "jobs/s", probe["rate"], higher_is_better=True,
            peer=peer_of("fill rate"))


def _wait_huey_scheduled(consumer: HueyConsumer, n: int, timeout: float) -> tuple[float, dict[str, int]]:
    """Wait until huey's consumer has moved all n far-future tasks from its queue table to its
    schedule table (a worker dequeues each, sees it is not due, and inserts it into
    `schedule`), logging progress about every 10 s. Returns (seconds waited, table counts)."""
    t0 = time.monotonic()
    next_report = t0 + 10.0
    while True:
        counts = huey_table_counts(consumer.db_path)
        if counts["task"] == 0 and counts["schedule"] >= n:
            return time.monotonic() - t0, counts
        now = time.monotonic()
        if now - t0 > timeout:
            raise TimeoutError(f"huey's consumer had not scheduled {n:,} tasks {timeout:.0f} s after the fill: "
                               f"{counts}")
        if consumer.proc is not None and consumer.proc.poll() is not None:
            raise RuntimeError(f"huey's consumer exited with {consumer.proc.returncode}:\n"
                               f"{consumer.out.tail() if consumer.out else ''}")
        if now > next_report:
            log(f"  huey consumer: {counts['schedule']:,} of {n:,} tasks in its schedule table")
            next_report = now + 10.0
        time.sleep(0.5)


def _huey_memory(s: Settings, res: Results, scenario: str, n: int) -> tuple[int, int, int, dict[str, Any],
                                                                              dict[str, Any]]:
    """huey's part of run_memory: its consumer runs (-w 4 -k thread); a client process calls
    noop.schedule(delay=FAR_FUTURE) n times; once the consumer has moved them all into its
    schedule table, the consumer's RSS and the SQLite files are measured, then again after a
    graceful stop. Adds the store rows; returns (RSS before, RSS after, VmHWM after, probe, raw)."""
    huey_python = s.huey()
    fill_max = 120.0 + n / 100  # one fsync'd commit per task; 100 tasks/s is far below anything seen
    with _fresh_dir(s, "huey") as d, HueyConsumer(s.huey_venv, Path(d)) as consumer:
        before = {p: proc_mem(p) for p in consumer.pids()}
        probe = run_probe(huey_python, "huey-fill", "--n", str(n), "--delay", str(FAR_FUTURE), "--dir", d,
                          "--max-seconds", str(fill_max), cwd=Path(d), timeout=fill_max + 60.0, progress=True)
        right_after_fill = {p: proc_mem(p) for p in consumer.pids()}
        drain_s, counts = _wait_huey_scheduled(consumer, n, timeout=120.0 + n / 100)
        after = {p: proc_mem(p) for p in consumer.pids()}
        files = sqlite_files(consumer.db_path)
        with contextlib.closing(sqlite3.connect(consumer.db_path, timeout=10.0)) as c:
            pages = {k: c.execute(f"PRAGMA {k}").fetchone()[0] for k in ("page_size", "page_count", "freelist_count")}
        stop_s = consumer.stop()
        files_stopped = sqlite_files(consumer.db_path)
    if counts["schedule"] != n:
        raise RuntimeError(f"{counts['schedule']:,} tasks in huey's schedule table for {n:,} scheduled")
    store_per_job = (files["db"] + files["db-wal"]) / n
    res.add(scenario, "store (db+wal) per job", HUEY, "bytes", store_per_job, higher_is_better=False)
    res.add(scenario, "store per job, after clean stop", HUEY, "bytes",
            (files_stopped["db"] + files_stopped["db-wal"]) / n, higher_is_better=False)
    res.add(scenario, "consumer scheduling after the fill", HUEY, "s", drain_s, higher_is_better=False)
    raw = {**probe, "before": before, "right_after_fill": right_after_fill, "after": after,
           "processes": len(after), "counts": counts, "files": files, "pages": pages,
           "files_after_stop": files_stopped, "stop_seconds": stop_s, "scheduling_seconds": drain_s}
    return (sum(v["VmRSS"] for v in before.values()), sum(v["VmRSS"] for v in after.values()),
            sum(v["VmHWM"] for v in after.values()), probe, raw)


RAW_SQLITE = {
    "WAL sync=FULL, 1 row/commit": ("FULL", 1),
    "WAL sync=FULL, 100 rows/commit": ("FULL", 100),
    "WAL sync=NORMAL, 1 row/commit": ("NORMAL", 1),
    "WAL sync=NORMAL, 100 rows/commit": ("NORMAL", 100),
}
RAW_TCP = "loopback, 1 connection"
RAW_LONE = "WAL sync=FULL, 1 row, 50 ms apart"
RAW_LONE_TCP = "loopback, 2 processes, 50 ms apart"


def run_raw_sqlite(s: Settings, res: Results, scenario: str, target: str) -> None:
    sync, rows = RAW_SQLITE[target]
    with _fresh_dir(s, "sqlite-raw") as d:
        probe = run_probe(sys.executable, "sqlite-commits", "--dir", d, "--sync", sync, "--rows", str(rows),
                          "--seconds", str(s.raw_seconds), timeout=60.0 + s.raw_seconds)
    res.add(scenario, "commits/s", target, "commits/s", probe["rate"], higher_is_better=True, raw=probe)
    if rows > 1:
        res.add(scenario, "rows/s", target, "rows/s", probe["rows_per_s"], higher_is_better=True)


def run_raw_lone(s: Settings, res: Results, scenario: str, target: str) -> None:
    with _fresh_dir(s, "sqlite-lone") as d:
        probe = run_probe(sys.executable, "sqlite-lone-commits", "--dir", d, "--sync", "FULL",
                          "--n", str(s.latency_samples), "--interval", "0.05", timeout=60.0 + s.latency_samples)
    for key in ("p50", "p90", "p99"):
        res.add(scenario, f"lone commit {key}", target, "ms", probe[f"{key}_ms"], higher_is_better=False,
                raw=probe if key == "p50" else None)


def _against_echo_server(s: Settings, *args: str, timeout: float) -> dict[str, Any]:
    """Run a probe against a fresh loopback echo server process."""
    server = _spawn([sys.executable, str(PROBES), "tcp-echo-server", "--max-seconds", str(30 + timeout)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_clean_env())
    try:
        port = int(LineWaiter(server).wait_for(LISTENING, timeout=20.0).group(2))
        return run_probe(sys.executable, args[0], "--port", str(port), *args[1:], timeout=timeout)
    finally:
        _kill_group(server)
        _reap(server)


def run_raw_tcp(s: Settings, res: Results, scenario: str, target: str) -> None:
    probe = _against_echo_server(s, "tcp-rtt", "--seconds", str(s.raw_seconds), timeout=60.0 + s.raw_seconds)
    res.add(scenario, "round trips/s", target, "trips/s", probe["rate"], higher_is_better=True, raw=probe)


def run_raw_lone_tcp(s: Settings, res: Results, scenario: str, target: str) -> None:
    probe = _against_echo_server(s, "tcp-lone-rtt", "--n", str(s.latency_samples), "--interval", "0.05",
                                 timeout=60.0 + s.latency_samples)
    for key in ("p50", "p90", "p99"):
        res.add(scenario, f"lone round trip {key}", target, "ms", probe[f"{key}_ms"], higher_is_better=False,
                raw=probe if key == "p50" else None)


# --- end to end, latency, idle, crash: every target runs jobs --------------------------------------
@dataclass
class Served:
    """A started target: how to run its probes and which process group it is."""

    target: str
    python: Path | str  # the Python its client probes run under
    kind: str  # probe kind prefix: queickd / queick / huey
    args: list[str]  # probe arguments that reach it
    cwd: Path | None  # the probe's working directory
    pgid: int
    handle: Any  # QueickdDaemon / QueickServer / HueyConsumer

    def probe(self, what: str, *args: str, timeout: float) -> dict[str, Any]:
        return run_probe(self.python, f"{self.kind}-{what}", *self.args, *args, cwd=self.cwd, timeout=timeout)


@contextlib.contextmanager
def serve(s: Settings, target: str, d: Path, workers: int = 4) -> Any:
    """Start target (queickd with `workers` workers, Queick with its defaults, huey's
    consumer with 4 threads) in data dir d; killed on leaving, on error too."""
    if target in QUEICKD_TARGETS:
        store, durability = QUEICKD_TARGETS[target]
        with QueickdDaemon(store, d, workers=workers, durability=durability) as daemon:
            yield Served(target, sys.executable, "queickd", ["--port", str(daemon.port), "--dir", str(d)], None,
                         daemon.pid, daemon)
    elif target == QUEICK:
        python = s.peer()
        with QueickServer(s.venv, d) as srv:
            assert srv.proc is not None
            yield Served(target, python, "queick", ["--dir", str(d)], d, srv.proc.pid, srv)
    elif target == HUEY:
        python = s.huey()
        with HueyConsumer(s.huey_venv, d) as consumer:
            assert consumer.proc is not None
            yield Served(target, python, "huey", ["--dir", str(d)], d, consumer.proc.pid, consumer)
    else:
        raise ValueError(target)


def _group_cpu(pgid: int) -> float:
    return sum(cpu for cpu, _ in group_usage(pgid).values())


def _peer(scenario: str, target: str, label: str) -> tuple[str, str, str] | None:
    return (scenario, QUEICK, label) if target not in (QUEICK, HUEY) else None


def run_e2e(s: Settings, res: Results, scenario: str, target: str) -> None:
    n = s.e2e_jobs
    queickd = target in QUEICKD_TARGETS
    label = f"rate (enqueue_many x{s.chunk})" if queickd else "rate (one at a time)"
    timeout = 60.0 + n / 20  # 20 jobs/s is far below anything seen; still bounded
    with _fresh_dir(s, "e2e") as d, serve(s, target, Path(d)) as srv:
        cpu0 = _group_cpu(srv.pgid)
        probe = srv.probe("e2e", "--n", str(n), "--chunk", str(s.chunk), "--max-seconds", str(timeout - 10),
                          timeout=timeout)
        server_cpu = _group_cpu(srv.pgid) - cpu0
    if probe["final_bytes"] != n:
        raise RuntimeError(f"{probe['final_bytes']} bytes for {n} jobs: some job ran twice")
    total_cpu = server_cpu + probe["client_cpu_s"]
    res.add(scenario, label, target, "jobs/s", probe["rate"], higher_is_better=True,
            peer=(scenario, QUEICK, "rate (one at a time)") if queickd else None,
            raw={**probe, "server_cpu_s": server_cpu})
    res.add(scenario, "CPU per job (server+client)", target, "µs", total_cpu / n * 1e6, higher_is_better=False,
            peer=_peer(scenario, target, "CPU per job (server+client)"))


def run_latency(s: Settings, res: Results, scenario: str, target: str) -> None:
    n, interval = s.latency_samples, 0.05
    with _fresh_dir(s, "latency") as d, serve(s, target, Path(d)) as srv:
        probe = srv.probe("latency", "--n", str(n), "--interval", str(interval), timeout=90.0 + n * interval)
    for key in ("p50", "p90", "p99"):
        label = f"enqueue→start {key}"
        res.add(scenario, label, target, "ms", probe[f"{key}_ms"], higher_is_better=False,
                peer=_peer(scenario, target, label), raw=probe if key == "p50" else None)


def run_idle(s: Settings, res: Results, scenario: str, target: str) -> None:
    with _fresh_dir(s, "idle") as d, serve(s, target, Path(d)) as srv:
        time.sleep(s.idle_warmup)
        u0, t0 = group_usage(srv.pgid), time.monotonic()
        time.sleep(s.idle_seconds)
        u1, t1 = group_usage(srv.pgid), time.monotonic()
    per_min = 60.0 / (t1 - t0)
    # processes present at both samples (a process that came or went in between is left out
    # and counted in the raw data)
    both = set(u0) & set(u1)
    cpu = sum(u1[p][0] - u0[p][0] for p in both)
    cs = sum(u1[p][1] - u0[p][1] for p in both)
    raw = {"warmup_s": s.idle_warmup, "measured_s": t1 - t0, "processes": sorted(both),
           "appeared_or_left": sorted(set(u0) ^ set(u1)), "cpu_s": cpu, "ctx_switches": cs}
    res.add(scenario, "CPU", target, "ms/min", cpu * 1000 * per_min, higher_is_better=False,
            peer=_peer(scenario, target, "CPU"), raw=raw)
    res.add(scenario, "context switches", target, "/min", cs * per_min, higher_is_better=False,
            peer=_peer(scenario, target, "context switches"))


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def _queue_empty(srv: Served) -> bool:
    """Nothing waiting or running, as far as the target can tell (Queick: nothing to ask)."""
    if srv.target == QUEICK:
        return True
    if srv.target == HUEY:
        return srv.handle.pending() == 0
    from queickd import JobQueue

    with JobQueue("127.0.0.1", srv.handle.port, timeout=10.0) as q:
        counts = q.stats()["counts"]
    return not any(counts.get(k, 0) for k in ("queued", "running", "scheduled", "waiting_network"))


def run_crash(s: Settings, res: Results, scenario: str, target: str) -> None:
    """A client enqueues append_line(tokens.out, token) one at a time and logs each ack;
    after s.crash_acks acks the target's whole process group gets SIGKILL; it restarts on
    the same data dir and drains; then acknowledged tokens never run and tokens run more
    than once are counted."""
    with _fresh_dir(s, "crash") as tmp:
        d = Path(tmp)
        acked_file, out_file = d / "acked.txt", d / "tokens.out"
        with serve(s, target, d) as srv:
            client = _spawn([str(srv.python), str(PROBES), f"{srv.kind}-crash", *srv.args, "--n", "1000000",
                             "--max-seconds", "300"], cwd=srv.cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_clean_env())
            try:
                deadline = time.monotonic() + 240.0
                while _count_lines(acked_file) < s.crash_acks:
                    if client.poll() is not None:
                        raise RuntimeError(f"crash client exited early:\n{client.communicate()[1][-2000:]}")
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"fewer than {s.crash_acks} acks in 240 s")
                    time.sleep(0.005)
                _kill_group(srv.handle.proc)  # kill -9: the daemon and anything it forked
                t_kill = time.monotonic()
                (d / "stop").touch()  # huey's client writes to the file itself: stop it too
                out, err = client.communicate(timeout=30.0)
            finally:
                _kill_group(client)
                _reap(client)
            if client.returncode != 0:
                raise RuntimeError(f"crash client failed with {client.returncode}:\n{err[-2000:]}")
            probe = json.loads([ln for ln in out.splitlines() if ln.strip()][-1])
            _reap(srv.handle.proc)
            # Queick's forked receiver must be gone (and 9999 free) before the restart
            if target == QUEICK:
                srv.handle.__exit__()
        ran_before_restart = _count_lines(out_file)
        with serve(s, target, d) as srv2:
            t_up = time.monotonic()
            acked = acked_file.read_text().split()
            want = set(acked)
            deadline, last_size, stable_since = time.monotonic() + 120.0, -1, time.monotonic()
            while time.monotonic() < deadline:
                text = out_file.read_text() if out_file.exists() else ""
                if want <= set(text.split()):
                    break
                if len(text) != last_size:
                    last_size, stable_since = len(text), time.monotonic()
                elif time.monotonic() - stable_since > 3.0 and _queue_empty(srv2):
                    break
                time.sleep(0.05)
            else:
                raise TimeoutError("the queue did not drain within 120 s of the restart")
            drained = time.monotonic() - t_up
    ran = text.split()
    counts: dict[str, int] = {}
    for tok in ran:
        counts[tok] = counts.get(tok, 0) + 1
    lost = [t for t in acked if t not in counts]
    dup = [t for t, c in counts.items() if c > 1]
    raw = {**probe, "acked": len(acked), "lines_run": len(ran), "ran_before_restart": ran_before_restart,
           "lost": len(lost), "lost_sample": lost[:20], "run_twice_or_more": len(dup), "dup_sample": dup[:20],
           "ran_unacked": len(set(counts) - want), "restart_to_drained_s": drained,
           "kill_to_restart_s": t_up - t_kill}
    res.add(scenario, "acknowledged before kill", target, "jobs", len(acked), higher_is_better=True, raw=raw)
    res.add(scenario, "acknowledged, never ran", target, "jobs", len(lost), higher_is_better=False,
            peer=_peer(scenario, target, "acknowledged, never ran"))
    res.add(scenario, "ran more than once", target, "jobs", len(dup), higher_is_better=False,
            peer=_peer(scenario, target, "ran more than once"))
    res.add(scenario, "restart to drained", target, "s", drained, higher_is_better=False)


@dataclass
class Scenario:
    name: str
    title: str
    targets: list[str]
    run: Callable[[Settings, Results, str, str], None]
    needs_peer: bool = False
    needs_huey: bool = False


def scenarios(s: Settings) -> list[Scenario]:
    out = [
        Scenario("enqueue-single", "enqueue, one request at a time",
                 [QUEICKD_SQLITE, QUEICKD_NORMAL, QUEICKD_MEMORY, QUEICK, HUEY],
                 run_enqueue, needs_peer=True, needs_huey=True),
        Scenario("enqueue-pipelined", f"enqueue_pipelined, chunks of {s.chunk}", [QUEICKD_SQLITE, QUEICKD_MEMORY],
                 run_enqueue),
        Scenario("enqueue-many", f"enqueue_many, chunks of {s.chunk}", [QUEICKD_SQLITE, QUEICKD_MEMORY],
                 run_enqueue),
    ]
    for n in s.memory_sizes:
        name = f"memory-{n // 1000}k" if n < 1_000_000 else f"memory-{n // 1_000_000}m"
        targets = [QUEICKD_SQLITE] + ([QUEICK] if n <= s.queick_memory_max else []) + \
            ([HUEY] if n <= s.huey_memory_max else [])

        def run(st: Settings, res: Results, scenario: str, target: str, n: int = n) -> None:
            run_memory(st, res, scenario, target, n)

        out.append(Scenario(name, f"memory/disk, {n:,} far-future jobs", targets, run,
                            needs_peer=QUEICK in targets, needs_huey=HUEY in targets))
    all4 = [QUEICKD_SQLITE, QUEICKD_MEMORY, QUEICK, HUEY]
    out += [
        Scenario("e2e", f"end to end, {s.e2e_jobs:,} append-byte jobs, 4 workers", all4, run_e2e,
                 needs_peer=True, needs_huey=True),
        Scenario("latency", f"enqueue→start, {s.latency_samples} single jobs 50 ms apart",
                 [QUEICKD_SQLITE, QUEICKD_NORMAL, QUEICKD_MEMORY, QUEICK, HUEY], run_latency,
                 needs_peer=True, needs_huey=True),
        Scenario("idle", f"idle, {s.idle_seconds:g} s after {s.idle_warmup:g} s warm-up",
                 [QUEICKD_SQLITE, QUEICK, HUEY], run_idle, needs_peer=True, needs_huey=True),
        Scenario("crash", f"kill -9 after {s.crash_acks:,} acks, restart", [QUEICKD_SQLITE, QUEICK, HUEY],
                 run_crash, needs_peer=True, needs_huey=True),
    ]
    out.append(Scenario("raw-sqlite", "raw: sqlite3 commits", list(RAW_SQLITE), run_raw_sqlite))
    out.append(Scenario("raw-lone-commit", "raw: lone fsync'd commit latency", [RAW_LONE], run_raw_lone))
    out.append(Scenario("raw-tcp", "raw: TCP request/response", [RAW_TCP], run_raw_tcp))
    out.append(Scenario("raw-lone-tcp", "raw: lone TCP round trip latency", [RAW_LONE_TCP], run_raw_lone_tcp))
    return out


def print_scenarios(all_scenarios: list[Any]) -> None:
    """--list: one line per scenario, its title and targets."""
    width = max(len(sc.name) for sc in all_scenarios) + 2
    for sc in all_scenarios:
        print(f"{sc.name:<{width}} {sc.title}  [{', '.join(sc.targets)}]")


def stop_on_sigterm() -> None:
    """SIGTERM ends a run like Ctrl-C, so the cleanup kills every process group it started."""
    def on_term(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)


def select(all_scenarios: list[Scenario], only: str | None) -> list[Scenario]:
    """--only takes names or prefixes, comma-separated: 'enqueue', 'memory-100k,raw'."""
    if not only:
        return all_scenarios
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    picked = [sc for sc in all_scenarios if any(sc.name == w or sc.name.startswith(w) for w in wanted)]
    unknown = [w for w in wanted if not any(sc.name == w or sc.name.startswith(w) for sc in all_scenarios)]
    if unknown:
        names = ", ".join(sc.name for sc in all_scenarios)
        raise SystemExit(f"bench: unknown scenario(s) {', '.join(unknown)}; choose from: {names}")
    return picked


# --- machine and report ---------------------------------------------------------------------------
def _fs_type(path: Path) -> str:
    best, fstype = "", "?"
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and str(path).startswith(parts[1]) and len(parts[1]) >= len(best):
                best, fstype = parts[1], f"{parts[2]} ({parts[0]} on {parts[1]})"
    return fstype


def machine_info(s: Settings) -> dict[str, Any]:
    cpu = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        mem = f"{int(f.readline().split()[1]) / 1024**2:.1f} GiB"
    try:
        from queickd import __version__ as qv
    except ImportError:  # pragma: no cover
        qv = "?"
    return {
        "nproc": os.cpu_count(), "cpu": cpu, "mem_total": mem, "kernel": platform.release(),
        "python": platform.python_version(), "sqlite": sqlite3.sqlite_version, "queickd": qv,
        "queick": QUEICK_VERSION, "huey": HUEY_VERSION, "tmp_dir": str(s.tmp_root), "tmp_fs": _fs_type(s.tmp_root.resolve()),
        "loadavg_start": os.getloadavg(),
    }


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit in ("MiB",) or abs(v) < 100:
        return f"{v:,.1f}"
    return f"{v:,.0f}"


def render(res: Results, order: list[Scenario], info: dict[str, Any], s: Settings) -> str:
    lines = [
        f"queickd {info['queickd']} vs Queick {QUEICK_VERSION}: {s.rounds} round(s)"
        f"{' (--quick)' if s.quick else ''}; {info['nproc']} CPUs ({info['cpu']}), {info['mem_total']} RAM,"
        f" Python {info['python']}, SQLite {info['sqlite']}, temp dirs on {info['tmp_fs']}",
        "ratio = queickd median / peer median (for rates >1 means queickd is faster; for sizes, CPU, latency"
        " and counts <1 means queickd uses less). * = compared with Queick one-at-a-time, its only enqueue mode.",
        "",
    ]
    rows: list[tuple[str, ...]] = []
    for sc in order:
        ms = [m for m in res.metrics.values() if m.scenario == sc.name]
        labels: list[str] = []
        for m in ms:
            if m.label not in labels and m.label != "error":
                labels.append(m.label)
        for label in labels:
            for target in sc.targets:
                m = res.metrics.get((sc.name, target, label))
                if m is None:
                    continue
                r = res.ratio(m)
                if m.target == QUEICK:
                    rs = "(peer)"
                elif r is None:
                    rs = "-"
                else:
                    rs = f"{r:,.2f}x" + ("*" if m.peer and m.peer[0] != sc.name else "")
                span = f"{_fmt(min(m.values), m.unit)}–{_fmt(max(m.values), m.unit)}" if m.values else "-"
                rows.append((sc.title, label, target, _fmt(m.median, m.unit), span, m.unit, rs))
        for target in sc.targets:
            m = res.metrics.get((sc.name, target, "error"))
            for e in m.errors if m is not None else []:
                first = e.strip().splitlines()[0] if e.strip() else "error"
                rows.append((sc.title, "FAILED", target, "", "", "", first))
        rows.append(())
    head = ("scenario", "metric", "target", "median", "min–max", "unit", "queickd/peer")
    widths = [max([len(h)] + [len(r[i]) for r in rows if r and r[1] != "FAILED"]) for i, h in enumerate(head)]
    right = {3, 4, 6}

    def fmt_row(r: tuple[str, ...]) -> str:
        if r[1] == "FAILED":
            return f"{r[0]:<{widths[0]}}  {'FAILED':<{widths[1]}}  {r[2]:<{widths[2]}}  {r[6]}"
        return "  ".join(f"{c:>{w}}" if i in right else f"{c:<{w}}" for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    lines.append(fmt_row(head))
    lines.append("-" * (sum(widths) + 2 * (len(widths) - 1)))
    prev = None
    for r in rows:
        if not r:
            lines.append("")
            prev = None
            continue
        shown = r if r[0] != prev else ("",) + r[1:]
        prev = r[0]
        lines.append(fmt_row(shown).rstrip())
    ctx = _context_lines(res)
    if ctx:
        lines += ["context:"] + [f"  {c}" for c in ctx] + [""]
    if res.notes:
        lines += ["notes:"] + [f"  - {n}" for n in res.notes]
    return "\n".join(lines)


def _context_lines(res: Results) -> list[str]:
    def med(scenario: str, target: str, label: str) -> float | None:
        m = res.metrics.get((scenario, target, label))
        return m.median if m else None

    out = []
    q1 = med("enqueue-single", QUEICKD_SQLITE, "enqueue rate")
    raw1 = med("raw-sqlite", "WAL sync=FULL, 1 row/commit", "commits/s")
    if q1 and raw1:
        out.append(f"queickd sqlite/full one-at-a-time enqueue = {q1 / raw1:.0%} of raw FULL 1-row commits/s"
                   " (each lone request is one fsync'd commit)")
    qk1 = med("enqueue-single", QUEICK, "enqueue rate")
    if qk1 and raw1:
        out.append(f"1.5x Queick one at a time = {1.5 * qk1:,.0f} acks/s; this disk did {raw1:,.0f} fsync'd 1-row commits/s"
                   f" ({raw1 / qk1:.2f}x Queick): the ceiling of a client that waits for each durable ack")
    lat, lone = med("latency", QUEICKD_SQLITE, "enqueue→start p50"), med("raw-lone-commit", RAW_LONE, "lone commit p50")
    if lat and lone:
        out.append(f"queickd sqlite/full latency p50 {lat:.1f} ms, of which a lone fsync'd commit alone takes "
                   f"{lone:.1f} ms (p50) on this disk")
    lat_m, trip = med("latency", QUEICKD_MEMORY, "enqueue→start p50"), med("raw-lone-tcp", RAW_LONE_TCP,
                                                                             "lone round trip p50")
    if lat_m and trip:
        out.append(f"queickd memory latency p50 {lat_m:.1f} ms, of which a lone loopback round trip between two "
                   f"idle processes alone takes {trip:.2f} ms (p50) on this machine")
    qm = med("enqueue-single", QUEICKD_MEMORY, "enqueue rate")
    rtt = med("raw-tcp", RAW_TCP, "round trips/s")
    if qm and rtt:
        out.append(f"queickd memory one-at-a-time enqueue = {qm / rtt:.0%} of raw loopback round trips/s")
    qk = med("enqueue-single", QUEICK, "enqueue rate")
    if qk and rtt:
        out.append(f"Queick one-at-a-time enqueue = {qk / rtt:.0%} of raw loopback round trips/s "
                   "(it opens a new TCP connection per job)")
    many = med("enqueue-many", QUEICKD_SQLITE, "enqueue rate")
    raw100 = med("raw-sqlite", "WAL sync=FULL, 100 rows/commit", "rows/s")
    if many and raw100:
        out.append(f"queickd sqlite/full enqueue_many = {many / raw100:.0%} of raw FULL 100-row-batch rows/s")
    e2e_q = next((m.label for m in res.metrics.values() if m.scenario == "e2e" and m.target == QUEICKD_SQLITE
                  and m.label.startswith("rate")), "")
    for scenario, label_q, label_h, what in (
        ("enqueue-single", "enqueue rate", "enqueue rate", "enqueue rate (one at a time)"),
        ("memory-100k", "store (db+wal) per job", "store (db+wal) per job", "store (db+wal) per job, 100k"),
        ("memory-100k", "store per job, after clean stop", "store per job, after clean stop",
         "store per job after clean stop, 100k"),
        ("memory-100k", "RSS after", "RSS after", "RSS with 100k scheduled"),
        ("e2e", e2e_q, "rate (one at a time)", "e2e rate"),
        ("e2e", "CPU per job (server+client)", "CPU per job (server+client)", "e2e CPU per job"),
        ("latency", "enqueue→start p50", "enqueue→start p50", "latency p50"),
        ("latency", "enqueue→start p99", "enqueue→start p99", "latency p99"),
        ("idle", "CPU", "CPU", "idle CPU"),
        ("idle", "context switches", "context switches", "idle context switches"),
    ):
        q, h = med(scenario, QUEICKD_SQLITE, label_q), med(scenario, HUEY, label_h)
        if q is not None and h:
            out.append(f"queickd sqlite/full vs huey: {what} {_fmt(q, '')} vs {_fmt(h, '')} = {q / h:.2f}x")
    return out


def to_json(res: Results, info: dict[str, Any], s: Settings, order: list[Scenario]) -> dict[str, Any]:
    return {
        "machine": info,
        "settings": {"rounds": s.rounds, "quick": s.quick, "enqueue_jobs": s.enqueue_jobs, "chunk": s.chunk,
                     "e2e_jobs": s.e2e_jobs, "latency_samples": s.latency_samples, "idle_warmup": s.idle_warmup,
                     "idle_seconds": s.idle_seconds, "crash_acks": s.crash_acks, "huey_venv": str(s.huey_venv),
                     "memory_sizes": s.memory_sizes, "queick_memory_max": s.queick_memory_max,
                     "huey_memory_max": s.huey_memory_max,
                     "raw_seconds": s.raw_seconds, "peer_venv": str(s.venv)},
        "scenarios": [{"name": sc.name, "title": sc.title, "targets": sc.targets} for sc in order],
        "results": [
            {"scenario": m.scenario, "metric": m.label, "target": m.target, "unit": m.unit,
             "values": m.values, "median": m.median, "min": min(m.values) if m.values else None,
             "max": max(m.values) if m.values else None, "ratio_vs_peer": res.ratio(m),
             "peer": list(m.peer) if m.peer else None, "errors": m.errors, "rounds": m.rounds}
            for m in res.metrics.values()
        ],
        "notes": res.notes,
    }


# --- main ------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.run",
        description="Benchmark queickd against Queick 1.2.1 and huey 3.5.4 (enqueue rate, memory and "
        "disk per queued job, end-to-end rate, latency, idle cost, kill -9) and measure the machine's raw "
        "SQLite and loopback TCP limits. Targets alternate over the rounds, each in a fresh process and "
        "temp dir.",
        epilog="Scenarios: enqueue-single, enqueue-pipelined, enqueue-many, memory-100k, memory-1m, "
        "e2e, latency, idle, crash, raw-sqlite, raw-tcp. The Queick and huey venvs are created on first "
        "use (see the top of bench/run.py).",
    )
    p.add_argument("--rounds", type=int, default=None, help="rounds per scenario (default: 3; 1 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="fast smoke run: 2,000 jobs per enqueue run, no 1M memory run, 0.5 s raw runs, "
                   "1,000 e2e jobs, 20 latency samples, 10 s + 10 s idle, 500 acks before the crash")
    p.add_argument("--only", metavar="SCENARIO", help="run only these scenarios (names or prefixes, comma-separated)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--jobs", type=int, default=None, help="jobs per enqueue run (default: 20,000; 2,000 with --quick)")
    p.add_argument("--chunk", type=int, default=1000, help="jobs per enqueue_many / pipelined chunk (default: 1000)")
    p.add_argument("--peer-venv", type=Path,
                   default=Path(os.environ.get("BENCH_QUEICK_VENV", CACHE_DIR / "queick-venv")),
                   help="virtualenv holding Queick 1.2.1, created if missing [env BENCH_QUEICK_VENV] "
                   "(default: bench/.bench-cache/queick-venv)")
    p.add_argument("--huey-venv", type=Path,
                   default=Path(os.environ.get("BENCH_HUEY_VENV", CACHE_DIR / "huey-venv")),
                   help=f"virtualenv holding huey {HUEY_VERSION}, created if missing [env BENCH_HUEY_VENV] "
                   "(default: bench/.bench-cache/huey-venv)")
    p.add_argument("--e2e-jobs", type=int, default=None, help="jobs per e2e run (default: 5,000; 1,000 with --quick)")
    p.add_argument("--idle-warmup", type=float, default=None,
                   help="seconds an idle target runs before measuring (default: 90; 10 with --quick)")
    p.add_argument("--idle-seconds", type=float, default=None,
                   help="seconds the idle cost is measured over (default: 30; 10 with --quick)")
    p.add_argument("--tmp-dir", type=Path, default=Path(tempfile.gettempdir()),
                   help="where the fresh per-run data dirs go; put it on the disk you care about "
                   "(default: %(default)s)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    return p


class TargetSkippedError(Exception):
    """A target that cannot run here: reported as SKIPPED with the reason, not as a failure."""


def run_rounds(order: Sequence[Any], s: Any, res: Results,
               skipped: dict[tuple[str, str], str] | None = None) -> None:
    """Run every scenario's targets in turn (A B C A B C ...), s.rounds times, each run on
    its own: a failed run is recorded and the others go on, and a target that raises
    TargetSkippedError is recorded in `skipped` and not tried again."""
    skipped = {} if skipped is None else skipped
    for sc in order:
        for r in range(s.rounds):
            for target in sc.targets:
                if (sc.name, target) in skipped:
                    continue
                log(f"{sc.name} round {r + 1}/{s.rounds}: {target}")
                t0 = time.perf_counter()
                try:
                    sc.run(s, res, sc.name, target)
                except TargetSkippedError as e:
                    skipped[(sc.name, target)] = f"skipped: {e}"
                    log(f"  skipped: {e}")
                except Exception as e:  # one failed run must not lose the others
                    log(f"  FAILED: {type(e).__name__}: {e}")
                    res.error(sc.name, target, f"round {r + 1}: {e}")
                finally:
                    kill_all()  # nothing outlives its run
                log(f"  done in {time.perf_counter() - t0:.1f} s")


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    rounds = a.rounds if a.rounds is not None else (1 if a.quick else 3)
    if rounds < 1 or (a.jobs is not None and a.jobs < 1) or not 1 <= a.chunk <= 10_000:
        raise SystemExit("bench: --rounds and --jobs must be positive, --chunk 1-10000")
    if (a.e2e_jobs is not None and a.e2e_jobs < 1) or (a.idle_warmup or 0) < 0 or (a.idle_seconds or 1) <= 0:
        raise SystemExit("bench: --e2e-jobs and --idle-seconds must be positive, --idle-warmup not negative")
    s = Settings(
        rounds=rounds, quick=a.quick, enqueue_jobs=a.jobs or (2_000 if a.quick else 20_000), chunk=a.chunk,
        memory_sizes=[100_000] if a.quick else [100_000, 1_000_000], queick_memory_max=100_000,
        raw_seconds=0.5 if a.quick else 2.0, tmp_root=a.tmp_dir.resolve(), venv=a.peer_venv.resolve(),
        e2e_jobs=a.e2e_jobs or (1_000 if a.quick else 5_000), latency_samples=20 if a.quick else 100,
        idle_warmup=a.idle_warmup if a.idle_warmup is not None else (10.0 if a.quick else 90.0),
        idle_seconds=a.idle_seconds or (10.0 if a.quick else 30.0), crash_acks=500 if a.quick else 2_000,
        huey_venv=a.huey_venv.resolve(),
    )
    order = select(scenarios(s), a.only)
    if a.list:
        print_scenarios(scenarios(s))
        return 0
    s.tmp_root.mkdir(parents=True, exist_ok=True)
    stop_on_sigterm()
    res = Results()
    info = machine_info(s)
    try:
        if any(sc.needs_peer for sc in order):
            try:
                s.peer_python = ensure_peer_venv(s.venv)
            except Exception as e:  # no registry, no venv module, ...: Queick's rows fail
                s.peer_error = f"{type(e).__name__}: {e}"
                log(f"cannot prepare the Queick venv ({s.peer_error}); its runs will fail")
        if any(sc.needs_huey for sc in order):
            try:
                s.huey_python = ensure_huey_venv(s.huey_venv)
            except Exception as e:
                s.huey_error = f"{type(e).__name__}: {e}"
                log(f"cannot prepare the huey venv ({s.huey_error}); its runs will fail")
        run_rounds(order, s, res)
    except KeyboardInterrupt:
        log("interrupted; reporting what was measured")
        res.notes.append("interrupted before the end")
    finally:
        kill_all()
    info["loadavg_end"] = os.getloadavg()
    names = {sc.name for sc in order}
    if names & {"enqueue-single"}:
        res.notes.append("queickd runs with --workers 0 during enqueue runs, so no job runs while they are "
                         "measured. Queick cannot be stopped from running jobs: its dispatcher process runs "
                         "each no-op (in a new thread pool per job) during its measurement, on the same 2 cores.")
        res.notes.append("enqueue-single: huey has no server; its client inserts each task into the SQLite file "
                         "itself (one fsync'd commit per task call), and no huey consumer runs during the "
                         "measurement (as queickd runs with --workers 0), so huey has no server CPU row and its "
                         "client CPU is the whole enqueue cost.")
    if any(n.startswith("memory") for n in names):
        res.notes.append("memory: queickd sqlite/full runs with 4 workers (jobs are far-future, none runs); "
                         "RSS is the daemon's. Queick's RSS is the sum over its process group (dispatcher + "
                         "receiver). In Queick 1.2.1 the first far-future job blocks its dispatcher inside "
                         "sched.run() until that job is due, so the later ones wait in the receiver's "
                         "multiprocessing.Queue buffer (and no immediate job would run meanwhile).")
        if any(HUEY in sc.targets for sc in order if sc.name.startswith("memory")):
            res.notes.append("memory: huey's consumer runs (-w 4 -k thread) while a client calls "
                             "noop.schedule(delay=10**7) once per task: huey has no batch enqueue and each call "
                             "commits on its own. The task lands in huey's queue table; a worker dequeues it, sees "
                             "it is not due and inserts it into the schedule table. RSS (the consumer's), store "
                             "bytes and the table counts are read once every task is in the schedule table "
                             "('consumer scheduling after the fill' is that wait); its fill rate is the client's, "
                             "with the consumer competing for the database. huey's SQLite connection has an 8 MB "
                             "page cache (cache_mb=8), a ceiling on its RSS growth. After a clean stop (SIGINT) "
                             "the last connection closes and SQLite checkpoints and removes the WAL.")
        if not s.quick and "memory-1m" in names:
            res.notes.append("memory-1m: Queick skipped at 1,000,000 jobs (one TCP connection per job, "
                             "~10 minutes per round here; it is not durable either). huey skipped too: one "
                             "fsync'd commit per task plus its consumer's move of each task to the schedule table "
                             "took 4 to 6 minutes for 100,000 tasks here, so most of an hour per round.")
    if "e2e" in names:
        res.notes.append(f"e2e: every target runs its jobs with 4 workers (Queick: its defaults); queickd gets "
                         f"the jobs with enqueue_many in chunks of {s.chunk}, Queick one TCP connection per job, "
                         "huey one task call (one SQLite insert by the client) per job. Timed from the first "
                         "enqueue until the output file holds N bytes; CPU is the daemon's process group plus "
                         "the client's (huey's client does the enqueue work itself).")
    if "latency" in names:
        res.notes.append("latency: the job itself appends time.time() - sent_at when it starts, so import and "
                         "dispatch costs count. huey's workers poll SQLite with a backoff (0.1 s growing x1.15 "
                         "per empty poll, up to 10 s), so its latency depends on its polling, not on a wake-up.")
    if "idle" in names:
        res.notes.append("idle: utime+stime from /proc/PID/stat and voluntary+involuntary context switches "
                         "over /proc/PID/task/*/status, summed over the process group; clock ticks are 10 ms, "
                         "so small CPU figures are coarse.")
    if "crash" in names:
        res.notes.append("crash: SIGKILL to the whole process group mid-load, restart on the same data (queickd "
                         "--store file, huey's SQLite file; Queick has nothing to restart from, so every job it "
                         "had not run yet is gone). 'never ran' counts acknowledged tokens absent after the "
                         "drain; 'ran more than once' counts tokens written twice or more (queickd re-runs jobs "
                         "that were running when killed: at least once; huey deletes a task from its table "
                         "before running it: at most once).")
    if any(HUEY in sc.targets for sc in order):
        res.notes.append(f"huey rows ({HUEY}) carry no ratio: the ratio column compares with Queick; see "
                         "context for queickd vs huey.")
    res.notes.append("Queick keeps every job in RAM and loses them on exit: it is not durable. queickd "
                     "sqlite/full acknowledges a job only after its transaction is fsync'd.")
    text = render(res, order, info, s)
    print(text, flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(to_json(res, info, s, order), indent=2) + "\n")
        log(f"wrote {a.json}")
    return 1 if res.has_errors() else 0


if __name__ == "__main__":
    sys.exit(main())
