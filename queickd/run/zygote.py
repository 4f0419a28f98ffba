"""The zygote: a long-lived, single-threaded fork server that has imported the job
modules and forks one fresh child per process job (`python -m queickd.run.zygote`).

The daemon is multi-threaded and must never fork itself; this process has one thread, so
a fork of it is safe. It talks to its supervisor (run/supervisor.py) over one AF_UNIX
SOCK_SEQPACKET socket (`--fd`), one JSON message per packet, with a job's output and
report pipes passed alongside (SCM_RIGHTS):

  -> {"op": "run", "id", "func", "args", "kwargs", "env", "env_job", "cwd", "rlimits",
      "cgroups", "max_result"} + [output fd, report fd]
  <- {"ready": pid, "failed": [...], "namespaces": why}
                                        started; the preloads that could not be imported;
                                        why jobs get no namespaces of their own (null: they do)
  <- {"id", "pid"}                      forked; the child runs (run/child.py)
  <- {"id", "report": {...}}            not forked: the function cannot be loaded
  <- {"id", "exit": status, "cpu": s}   the child is reaped and nothing it started is left
  -> {"op": "reload"}                   import the app modules afresh (SIGHUP)
  <- {"reloaded": [...], "failed": {}}  done; a module that failed keeps its last good code

A reload (SIGHUP, or an app module changed on disk, seen before a fork) imports the app
modules afresh in place, with the loader's rule: a module that fails keeps its last good
code. As the subreaper of its children's descendants, it kills and reaps what a job left
behind (setsid ones included) before it reports the job's exit. It wakes only for a
request or a SIGCHLD, and exits when its socket closes (a daemon killed with SIGKILL
too). It runs no job code itself but the import of job modules, and never unpickles.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import errno
import gc
import json
import logging
import os
import selectors
import signal
import socket
import sys
from typing import Any

from ..core.protocol import QueueError
from . import capture, child, isolate
from .base import RunReport
from .loader import FunctionLoader

MAX_PACKET = 1 << 22  # a request's JSON: arguments are bounded by the protocol's line limit
_ANC_SPACE = socket.CMSG_SPACE(4 * array.array("i").itemsize)  # room for up to 4 descriptors


class Zygote:
    def __init__(self, sock: socket.socket, loader: FunctionLoader) -> None:
        self.sock = sock
        self.loader = loader
        self.jobs: dict[int, int] = {}  # pid -> request id of the running children
        self.mtimes: dict[str, float] = {}  # app module files imported, at their import mtime
        self._modules_seen = 0  # len(sys.modules) at the last _note_modules
        self.env: dict[str, str] | None = None  # the runner's environment, once set here
        self._buf = bytearray(MAX_PACKET)
        self.namespaces: str | None = "not probed"  # why jobs get no namespaces of their own (None: they do)

    # --- imports -----------------------------------------------------------------------------
    def preload(self, funcs: list[str]) -> list[str]:
        """Import the functions' modules; the names of those that failed."""
        failed = []
        for func in funcs:
            try:
                self.loader.resolve(func)
            except BaseException as e:  # SystemExit at import too: it fails its own jobs, later
                failed.append(func)
                print(f"queickd zygote: cannot preload {func}: {type(e).__name__}: {_short(e)}",
                      file=sys.stderr, flush=True)
        self._note_modules()
        return failed

    def _note_modules(self) -> None:
        """Note the app modules imported since the last call, and freeze what this process
        holds now out of the garbage collector's reach: a collection in the zygote or in a
        child would write to every object (their GC headers), copying each page a child
        shares with the zygote (the cost of a fork is the pages copied)."""
        if len(sys.modules) == self._modules_seen:
            return  # nothing imported since: the usual job
        self._modules_seen = len(sys.modules)
        self.env = None  # an import may have changed the environment: the next job sets it again
        gc.freeze()
        for mod in list(sys.modules.values()):
            path = getattr(mod, "__file__", None)
            if path and path not in self.mtimes and path.startswith(self.loader.app_dir + os.sep):
                with contextlib.suppress(OSError):
                    self.mtimes[path] = os.stat(path).st_mtime

    def reload(self, why: str) -> None:
        """Import the app modules afresh in place (FunctionLoader.reload): one that fails
        keeps its old module. Every file imported is noted at its mtime now, a failed one
        too: it is not tried again before the next change or reload."""
        done = self.loader.reload()
        for path in list(self.mtimes):
            try:
                self.mtimes[path] = os.stat(path).st_mtime
            except OSError:
                del self.mtimes[path]
        self._modules_seen = 0  # noted again (and frozen) at the next job
        self._note_modules()
        self.send({"reloaded": done.modules, "failed": done.failed, "why": why})

    def stale(self) -> bool:
        """Has an app module this process imported changed on disk since?"""
        for path, mtime in self.mtimes.items():
            try:
                if os.stat(path).st_mtime != mtime:
                    return True
            except OSError:
                return True
        return False

    # --- the loop ----------------------------------------------------------------------------
    def send(self, msg: dict[str, Any]) -> None:
        self._send(json.dumps(msg).encode())

    def send_report(self, rid: int, report: RunReport) -> None:
        """A job's report in one packet, which must fit the socket's send buffer: its text
        cut (capture.fit). If even that cannot be sent, a short one saying so, never none:
        the job's watch waits for an answer."""
        packet = json.dumps({"id": rid, "report": capture.fit(report).to_dict()}, ensure_ascii=False)
        try:
            self.sock.send(packet.encode("utf-8", "backslashreplace"))
        except OSError as e:
            short = RunReport(False, None, "sandbox_setup", f"the zygote could not send the job's "
                              f"{report.error_type} report ({len(packet)} characters): {e}", None)
            self.send({"id": rid, "report": short.to_dict()})

    def _send(self, packet: bytes) -> None:
        with contextlib.suppress(OSError):  # the supervisor is gone: the loop sees the socket close
            self.sock.send(packet)

    def serve(self) -> None:
        r, w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        signal.set_wakeup_fd(w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # the byte in the pipe is what counts
        # SIGTERM to every process of the unit (systemd's stop) is the daemon's to act on:
        # it stops the zygote itself, once its running jobs are done (its socket closes).
        signal.signal(signal.SIGTERM, lambda *_: None)
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ)
        sel.register(r, selectors.EVENT_READ)
        while True:
            self.reap()
            for key, _ in sel.select():
                if key.fileobj is self.sock:
                    if not self.receive():
                        self.kill_all()
                        return
                else:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(r, 512):
                            pass

    def receive(self) -> bool:
        try:
            # Into one buffer kept for every request: socket.recv_fds allocates its whole
            # size (4 MB) per call, pages this process would map, touch and unmap each job.
            n, anc, _, _ = self.sock.recvmsg_into([self._buf], _ANC_SPACE)
        except InterruptedError:
            return True
        except OSError:
            return False
        got = array.array("i")
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got.frombytes(data[:len(data) - len(data) % got.itemsize])
        fds = list(got)
        try:
            if not n:
                return False
            msg = json.loads(self._buf[:n])
            if msg.get("op") == "reload":
                self.reload("SIGHUP")
            elif msg.get("op") == "run":
                self.start(msg, fds)
                fds = []
        finally:
            for fd in fds:
                os.close(fd)
        return True

    def start(self, req: dict[str, Any], fds: list[int]) -> None:
        try:
            if len(fds) != 2:
                self.send_report(req["id"], capture.refused("sandbox_setup", "the job's pipes did not arrive"))
                return
            if self.stale():
                self.reload("an app module changed on disk")
            try:
                fn = self.loader.resolve(req["func"])
            except BaseException as e:  # a module's SystemExit or KeyboardInterrupt too: we live on
                report = capture.failed(e, 0.0)
                if isinstance(e, QueueError):  # not allowed, or no such function: retrying cannot help
                    report = capture.refused(e.code, e.message)
                self.send_report(req["id"], report)
                return
            self._note_modules()
            if req["env"] != self.env:
                # The runner's environment, the same for each of its jobs, held by this
                # process: a child then sets only its own part (HOME, TMPDIR, ...).
                os.environ.clear()
                os.environ.update(req["env"])
                self.env = req["env"]
            if self.namespaces is not None:
                req["isolate"] = None  # the kernel refused them at start (said in "ready")
            pid = os.fork()
            if pid == 0:
                self.sock.close()
                child.run(req, fds[0], fds[1], fn)  # never returns
            with contextlib.suppress(OSError):
                os.setpgid(pid, pid)  # as the child does itself: whoever is first
            self.jobs[pid] = req["id"]
            # The two messages of every job, written as JSON by hand: the encoder's objects
            # are pages this process would write again after each fork (each one copied).
            self._send(b'{"id": %d, "pid": %d}' % (req["id"], pid))
        finally:
            for fd in fds:
                os.close(fd)

    def reap(self) -> None:
        """Reap every child that has ended; for a job's, first kill what it left behind."""
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            rid = self.jobs.pop(pid, None)
            if rid is None:
                continue  # a leftover, reaped
            self.kill_leftovers()
            self._send(b'{"id": %d, "exit": %d, "cpu": %.6f}' % (rid, status, usage.ru_utime + usage.ru_stime))

    def kill_leftovers(self) -> None:
        """Every child of ours that is not a running job's process was left behind by a job
        that has ended (its descendants become ours as each parent dies): kill them all."""
        for _ in range(1000):
            left = [p for p in _children() if p not in self.jobs]
            if not left:
                return
            for p in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
            for p in left:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(p, 0)

    def kill_all(self) -> None:
        for pid in list(self.jobs):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        self.jobs.clear()
        self.kill_leftovers()


def _short(e: BaseException, most: int = 500) -> str:
    try:
        text = str(e)
    except Exception:
        return f"<unprintable {type(e).__name__}>"
    return text if len(text) <= most else text[:most] + "…"


def _children() -> list[int]:
    """This process's children, from /proc."""
    me = os.getpid()
    try:
        fd = os.open(f"/proc/{me}/task/{me}/children", os.O_RDONLY)
    except OSError:
        pass
    else:
        try:
            return [int(p) for p in os.read(fd, 1 << 16).split()]
        finally:
            os.close(fd)
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(b")", 1)[1].split()[1]) == me:
                out.append(int(name))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m queickd.run.zygote")
    p.add_argument("--app-dir", default=".")
    p.add_argument("--allow", action="append", default=[])
    p.add_argument("--preload", action="append", default=[])
    p.add_argument("--fd", type=int, required=True, help="the supervisor's socket")
    p.add_argument("--no-namespaces", action="store_true", help="jobs share the zygote's namespaces")
    a = p.parse_args(argv)
    # No parent-death signal here: it follows the daemon *thread* that started this process,
    # and a restart may come from a short-lived one. The socket closing is the daemon's end.
    dumpable = isolate.not_dumpable()  # before any job module runs (its import)
    if dumpable is not None:
        print(f"queickd zygote: cannot make itself non-dumpable ({dumpable}): a job of the same user "
              "may read its memory", file=sys.stderr, flush=True)
    if isolate.prctl(isolate.PR_SET_CHILD_SUBREAPER, 1) != 0:
        print("queickd zygote: cannot become a subreaper; a job's setsid children may outlive it",
              file=sys.stderr, flush=True)
    child.open_stdio()  # once here, not in each child
    child.warm_up()
    sock = socket.socket(fileno=a.fd)
    # The loader's reload log goes to the supervisor as a message, logged there once.
    logging.getLogger("queickd.loader").disabled = True
    z = Zygote(sock, FunctionLoader(a.app_dir, a.allow, announce=False))
    # Probed before the app is imported: the probe forks, and the smaller this process the cheaper.
    z.namespaces = "--job-namespaces off" if a.no_namespaces else isolate.probe()
    failed = z.preload(a.preload)
    z.send({"ready": os.getpid(), "failed": failed, "namespaces": z.namespaces})
    try:
        z.serve()
    except OSError as e:
        if e.errno != errno.EBADF:
            raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
