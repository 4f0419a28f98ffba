"""The bench's processes: spawning targets and probes in their own process groups,
killing and reaping them (every group is killed at the end, even on error), reading their
CPU, memory and context switches from /proc, waiting for their log lines, loopback ports,
and starting queickd itself. It owns no scenario and no report.
"""

from __future__ import annotations

import compileall
import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
CACHE_DIR = BENCH_DIR / ".bench-cache"
PROBES = BENCH_DIR / "probes.py"
JOBS_FILE = BENCH_DIR / "benchjobs.py"
LISTENING = re.compile(r"listening on (\S+):(\d+)")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- processes ---------------------------------------------------------------------------------
_LIVE: list[subprocess.Popen] = []  # started and not yet reaped; killed by kill_all()


_SLOWED: dict[str, str] = {}  # the slow-fsync shim's variables while a scenario asks for it


def _clean_env(extra_path: bool = False) -> dict[str, str]:
    """This environment minus anything that would change a daemon's config or a venv's
    imports (QUEICKD_*, systemd's variables, PYTHONPATH/PYTHONHOME), plus the slow-fsync
    shim inside slow_fsync(). With extra_path (queickd's own processes), PYTHONPATH is the
    checkout of default_queickd_path(), so they run the code this bench was pointed at."""
    drop = ("JOURNAL_STREAM", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "PYTHONPATH", "PYTHONHOME")
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEICKD_") and k not in drop}
    path = default_queickd_path() if extra_path else None
    if path is not None:
        env["PYTHONPATH"] = str(path)
    return {**env, **_SLOWED}


@functools.cache
def default_queickd_path() -> Path | None:
    """The first $PYTHONPATH entry holding a queickd package, else where this Python imports
    queickd from. ($PYTHONPATH first: `python -m bench.run` puts the working directory ahead
    of it, and the point of PYTHONPATH=... is to pick another checkout.)"""
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and (Path(entry) / "queickd" / "__init__.py").exists():
            return Path(entry).resolve()
    spec = importlib.util.find_spec("queickd")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).resolve().parent.parent


def compile_sources(queickd_path: Path | None) -> None:
    """Byte-compile the queickd under test and the bench's job modules, as pip leaves an
    installed package (the peers' venvs are): where PYTHONDONTWRITEBYTECODE is set, every
    process started from a source checkout would compile each module it imports (a
    daemon's start 620 ms instead of 370 here), which only queickd's rows would pay."""
    for folder in ([queickd_path / "queickd"] if queickd_path else []) + [BENCH_DIR]:
        compileall.compile_dir(folder, quiet=1, maxlevels=10 if folder != BENCH_DIR else 0)


def copy_job_modules(dest_dir: Path, python: Path | str) -> None:
    """Copy benchjobs.py into dest_dir (where a peer imports its jobs from) and byte-compile
    every module there under `python`, the peer's interpreter (its cache tag): a user's
    first import writes that bytecode, and Queick 1.2.1 re-imports the job module twice
    per job (`importlib.reload` in job.py): without it, where PYTHONDONTWRITEBYTECODE is
    set, each of its jobs would compile the module's source twice, which no user pays."""
    shutil.copy(JOBS_FILE, dest_dir / JOBS_FILE.name)
    subprocess.run([str(python), "-m", "compileall", "-q", "-l", str(dest_dir)], check=True, timeout=120,
                   capture_output=True, env=_clean_env())


def build_slow_fsync(cache_dir: Path = CACHE_DIR) -> Path:
    """The LD_PRELOAD shim of bench/slowfsync.c, built with the system C compiler (`cc`)
    into the cache dir once per version of its source."""
    source = BENCH_DIR / "slowfsync.c"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    lib = cache_dir / f"slowfsync-{digest}.so"
    if not lib.exists():
        cc = shutil.which("cc")
        if cc is None:
            raise RuntimeError("no C compiler (cc) to build the slow-fsync shim")
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(source), "-ldl"], check=True,
                       capture_output=True, timeout=120)
        tmp.replace(lib)
    return lib


@contextlib.contextmanager
def slow_fsync(ms: float) -> Iterator[None]:
    """Every process started inside gets the shim: each fsync/fdatasync takes `ms` longer."""
    _SLOWED.update(LD_PRELOAD=str(build_slow_fsync()), SLOW_FSYNC_MS=str(int(ms)))
    try:
        yield
    finally:
        _SLOWED.clear()


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


def stop_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM to the process group `proc` leads, SIGKILL after `grace` seconds; reaped."""
    _kill_group(proc, signal.SIGTERM)
    _reap(proc, grace)


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


def proc_written(pid: int | str = "self") -> int:
    """Bytes a process has caused to be written to storage so far (/proc/PID/io
    write_bytes: counted when it dirties a page of a file, whoever writes it back later)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


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
                           text=True, env=_clean_env(extra_path=True))
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


def sqlite_files(db_path: Path) -> dict[str, int]:
    """Sizes of a SQLite database and its -wal and -shm files (0 when absent), in bytes."""
    out = {}
    for suffix in ("", "-wal", "-shm"):
        p = Path(f"{db_path}{suffix}")
        out["db" + suffix] = p.stat().st_size if p.exists() else 0
    return out



def run_probe(python: str | Path, kind: str, *args: str, cwd: Path | None = None,
              timeout: float = 600.0, progress: bool = False) -> dict[str, Any]:
    """Run one measurement in a fresh process; returns its JSON result. With progress=True
    the probe's stderr (its progress lines, and a traceback on failure) goes straight to
    this script's stderr instead of into the error message."""
    cmd = [str(python), str(PROBES), kind, *args]
    proc = _spawn(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=None if progress else subprocess.PIPE, text=True,
                  env=_clean_env(extra_path=str(python) == sys.executable))
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


