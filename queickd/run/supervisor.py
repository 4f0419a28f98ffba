"""The daemon's side of the zygote (run/zygote.py): starts it with `subprocess`, hands it
jobs, routes its replies to the worker threads waiting for them, and restarts it when it
dies (with backoff, logged); `reload()` (SIGHUP) has it re-import the app in place.

One reader thread per zygote waits on its socket (no wake-ups while no job runs). The
zygote gets a minimal environment (no store URL, no token, nothing QUEICKD_*): only what
it needs to find Python and the job modules. Never forks the daemon (subprocess execs a
fresh interpreter) and never decides a job's fate.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("queickd.sandbox")

START_TIMEOUT = 30.0  # seconds a new zygote gets to import the job modules
MAX_BACKOFF = 30.0
STABLE_AFTER = 60.0  # a zygote alive this long resets the backoff
MAX_REPLY = 1 << 20  # bytes of one message from the zygote (a report with its traceback)
_ZYGOTE_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "HOME")


class ZygoteUnavailableError(RuntimeError):
    """No zygote could be started (its error is logged); the job fails as crashed."""


@dataclass
class Pending:
    """One request to a zygote: the replies come to `replies`, and a byte to `wake_w` for
    the worker thread's selector. The child's pid, kept in `pid`, wakes the thread only when
    `wake_on_pid` (a memory watch, a kill waiting for it). `wake_r`/`wake_w` are the
    caller's when it passed them (reused job after job), else this request's own."""

    id: int
    wake_r: int
    wake_w: int
    func: str = ""  # the job's function, preloaded by the next zygotes once it has imported
    replies: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    zygote: Any = None  # the _Zygote it went to
    pid: int | None = None
    wake_on_pid: bool = False
    owns_wake: bool = True

    def post(self, msg: dict[str, Any]) -> None:
        with self.lock:
            self.replies.append(msg)
            quiet = "pid" in msg and not self.wake_on_pid
            if "pid" in msg:
                self.pid = msg["pid"]
        if not quiet:
            with contextlib.suppress(OSError):
                os.write(self.wake_w, b"\0")

    def want_pid(self) -> int | None:
        """The child's pid; if it has not come yet, its arrival will wake the thread."""
        with self.lock:
            if self.pid is None:
                self.wake_on_pid = True
            return self.pid

    def take(self) -> list[dict[str, Any]]:
        with self.lock:
            out, self.replies = self.replies, []
        return out

    def close(self) -> None:
        if self.owns_wake:
            for fd in (self.wake_r, self.wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)


class _Zygote:
    """One zygote process and its socket."""

    def __init__(self, sup: ZygoteSupervisor) -> None:
        self.sup = sup
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: v for k, v in os.environ.items() if k in _ZYGOTE_ENV}
        # The job modules and queickd itself must import in the zygote as they do here.
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        # -P: not the cwd (the app directory) first on its path, where an app module named like
        # a standard one (csv.py) would be imported in its place; the loader puts it last.
        cmd = [sys.executable, "-P", "-m", "queickd.run.zygote", "--app-dir", sup.app_dir]
        cmd += [x for a in sup.allow for x in ("--allow", a)]
        with sup._preload_lock:
            preload = sorted(sup.preload)
        cmd += [x for f in preload for x in ("--preload", f)]
        cmd += ["--fd", str(theirs.fileno())]
        if not sup.namespaces_wanted:
            cmd.append("--no-namespaces")
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), env=env,
                                         cwd=sup.app_dir, close_fds=True, start_new_session=True)
        finally:
            theirs.close()
        self.sock = ours
        self.pending: dict[int, Pending] = {}
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.dead = False
        self.gone = threading.Event()  # set once its death is handled (the restart planned)
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._read, name="queickd-zygote-reader", daemon=True)
        self.thread.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        buf = bytearray(MAX_REPLY)  # one buffer for every message: recv(n) would allocate n bytes each
        while True:
            try:
                n = self.sock.recv_into(buf)
            except OSError:
                n = 0
            if not n:
                break
            msg = json.loads(buf[:n])
            if "ready" in msg:
                self.sup.namespaces = msg.get("namespaces", "not probed")
                self.sup._imported(msg.get("failed") or (), ok=False)
                self.ready.set()
                continue
            if "reloaded" in msg:
                for name, why in (msg.get("failed") or {}).items():
                    log.error("zygote reload: %s failed to import, the old code keeps serving: %s", name, why)
                log.info("zygote reload (%s): %d module(s) imported afresh", msg.get("why"), len(msg["reloaded"]))
                continue
            with self.lock:
                p = self.pending.get(msg.get("id"))
            if p is not None:
                if "pid" in msg or "report" in msg:  # its function imported (forked), or not
                    self.sup._imported((p.func,), ok="pid" in msg)
                p.post(msg)
        with self.lock:
            self.dead = True
            waiting = list(self.pending.values())
        self.ready.set()
        code = self.proc.wait()
        for p in waiting:
            p.post({"id": p.id, "zygote_died": code})
        self.sock.close()
        try:
            self.sup._ended(self, code)
        finally:
            self.gone.set()

    def send(self, p: Pending, msg: dict[str, Any], fds: Sequence[int]) -> None:
        with self.lock:
            if self.dead:
                raise ZygoteUnavailableError("the zygote has died")
            self.pending[p.id] = p
        p.zygote = self
        try:
            socket.send_fds(self.sock, [json.dumps(msg).encode()], list(fds))
        except OSError as e:
            self.forget(p)
            raise ZygoteUnavailableError(f"cannot reach the zygote: {e}") from None

    def forget(self, p: Pending) -> None:
        with self.lock:
            self.pending.pop(p.id, None)


class ZygoteSupervisor:
    """Starts, hands jobs to, restarts and reloads the zygote. Safe from any thread."""

    def __init__(self, app_dir: str, allow: Sequence[str] = (), preload: Sequence[str] = (),
                 namespaces: bool = True) -> None:
        self.app_dir = os.path.realpath(app_dir)
        self.namespaces_wanted = namespaces
        # Why process jobs get no PID and mount namespaces of their own (None: they do), as
        # the last zygote to start found; "not probed" before the first one has.
        self.namespaces: str | None = "not probed yet: the zygote starts with the first process job"
        self.allow = tuple(allow)
        # Functions the next zygote imports before it forks: those named at start and those
        # that have imported in a zygote since; one whose import fails is dropped, so that a
        # module that ends the zygote as it imports (os._exit, a crash) ends no other.
        self.preload: set[str] = set(preload)
        self._preload_lock = threading.Lock()
        self.restarts = 0
        self._zygote: _Zygote | None = None
        self._lock = threading.Lock()
        self._ids = 0
        self._failures = 0  # deaths in a row, for the backoff
        self._not_before = 0.0  # monotonic: no new zygote before this (backoff)
        self._stopping = False
        self._stop = threading.Event()

    # --- state ---------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        z = self._zygote
        return z is not None and not z.dead

    @property
    def pid(self) -> int | None:
        z = self._zygote
        return z.pid if z is not None and not z.dead else None

    def start(self) -> None:
        """Start the zygote now (else it starts with the first process job)."""
        self._current()

    def stop(self) -> None:
        """Stop the zygote; its running children die with it. Idempotent, safe before start."""
        self._stopping = True
        self._stop.set()
        with self._lock:
            z, self._zygote = self._zygote, None
        if z is not None:
            z.sock.close() if z.dead else z.sock.shutdown(socket.SHUT_RDWR)
            try:
                z.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                z.proc.kill()

    def reload(self, why: str = "SIGHUP") -> None:
        """Have the zygote import the app modules afresh for the next jobs, in place: a
        module that fails to import keeps its last good code there, as it does for thread
        jobs (FunctionLoader.reload). Running jobs keep what they started with. With no
        zygote running, the next one imports them anyway."""
        z = self._zygote
        if z is None or z.dead:
            return
        log.info("re-importing the job modules (%s) in the zygote (pid %d)", why, z.pid)
        with contextlib.suppress(OSError):  # it is dying: the next one imports afresh
            z.sock.send(b'{"op": "reload"}')

    # --- jobs ----------------------------------------------------------------------------
    def submit(self, func: str, msg: dict[str, Any], fds: Sequence[int], *, wake: tuple[int, int] | None = None,
               wake_on_pid: bool = False) -> Pending:
        """Hand one job to the zygote; replies come to the returned Pending. `wake`: the
        caller's own non-blocking pipe for the wake-ups (else one is made for this job).
        Raises ZygoteUnavailableError when no zygote can be had."""
        r, w = wake if wake is not None else os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        with self._lock:
            self._ids += 1
            p = Pending(self._ids, r, w, func, wake_on_pid=wake_on_pid, owns_wake=wake is None)
        msg = {**msg, "id": p.id}
        died = 0  # zygotes that died just as the job was sent to them
        try:
            while True:
                z = self._current()
                try:
                    z.send(p, msg, fds)
                    break
                except ZygoteUnavailableError:
                    # Not the job's fault: it has not started, so it must not fail for it. A
                    # zygote that died just now, its reader may not have seen it yet: once
                    # that is handled (the restart planned), once more with a new one.
                    died += 1
                    if died > 1 or not z.gone.wait(START_TIMEOUT):
                        raise
        except ZygoteUnavailableError:
            p.close()
            raise
        return p

    def done(self, p: Pending) -> None:
        """The job's replies are all in: forget it and close its wake-up pipe."""
        if p.zygote is not None:
            p.zygote.forget(p)
        p.close()

    def _imported(self, funcs: Sequence[str], ok: bool) -> None:
        """Note which functions imported in a zygote (`ok`) and which failed to."""
        for func in funcs:
            if func and (func in self.preload) != ok:  # the usual job changes nothing: no lock taken
                with self._preload_lock:
                    if ok:
                        self.preload.add(func)
                    else:
                        self.preload.discard(func)

    def _current(self) -> _Zygote:
        with self._lock:
            z = self._zygote
            if z is not None and not z.dead:
                return z
            if self._stopping:
                raise ZygoteUnavailableError("the daemon is stopping")
            wait = self._not_before - time.monotonic()
            if wait > 0 and self._stop.wait(wait):  # the backoff after a death (at most 30 s)
                raise ZygoteUnavailableError("the daemon is stopping")
            try:
                z = _Zygote(self)
            except OSError as e:
                self._backoff()
                log.error("cannot start the zygote: %s", e)
                raise ZygoteUnavailableError(f"cannot start the zygote: {e}") from None
            self._zygote = z
        if not z.ready.wait(START_TIMEOUT) or z.dead:
            log.error("the zygote (pid %d) did not start", z.pid)
            raise ZygoteUnavailableError("the zygote did not start")
        log.info("zygote started (pid %d, %d function(s) preloaded; pid and mount namespaces per job: %s)",
                 z.pid, len(self.preload), "yes" if self.namespaces is None else f"no ({self.namespaces})")
        return z

    def _backoff(self) -> None:
        self._failures += 1
        self._not_before = time.monotonic() + min(MAX_BACKOFF, 0.1 * 2 ** (self._failures - 1))

    def _ended(self, z: _Zygote, code: int) -> None:
        with self._lock:
            current = self._zygote is z
            if current:
                self._zygote = None
            if self._stopping:
                return
            if time.monotonic() - z.started > STABLE_AFTER:
                self._failures = 0
            self._backoff()
            self.restarts += 1
            delay = self._not_before - time.monotonic()
        log.warning("the zygote (pid %d) died (exit status %s); restarting it in %.1f s", z.pid, code, delay)
        timer = threading.Timer(max(delay, 0.0), self._restart)
        timer.daemon = True
        timer.start()

    def _restart(self) -> None:
        try:
            self._current()
        except ZygoteUnavailableError as e:
            log.warning("zygote restart: %s; trying again with the next process job", e)
