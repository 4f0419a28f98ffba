"""Jobs for the sandbox tests: each misbehaves in one way a process job must survive."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time


def noop() -> None:
    return None


def whoami() -> dict:
    """Where it ran: its pid, cwd and whole environment."""
    return {"pid": os.getpid(), "cwd": os.getcwd(), "env": dict(os.environ)}


def spin() -> None:
    while True:
        pass


def deaf() -> None:
    """Ignores SIGTERM and waits: only the SIGKILL after the grace ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)


def hog() -> None:
    """Touched memory, 10 MB at a time, up to 2 GB (a bytearray of zeros would not be resident)."""
    chunks = []
    for _ in range(200):
        chunks.append(b"x" * (10 << 20))


def allocate(mb: int) -> int:
    block = b"x" * (mb << 20)
    return len(block) >> 20


def burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def spawn_and_hang(pidfile: str) -> None:
    """A grandchild in its process group, one that calls setsid, then hang."""
    a = subprocess.Popen(["sleep", "300"])
    b = subprocess.Popen(["sleep", "301"], start_new_session=True)
    with open(pidfile, "w") as f:
        f.write(f"{a.pid} {b.pid}\n")
    while True:
        time.sleep(1)


def spawn_and_return(pidfile: str) -> str:
    b = subprocess.Popen(["sleep", "302"], start_new_session=True)
    with open(pidfile, "w") as f:
        f.write(f"{b.pid}\n")
    return "left one behind"


def flood(megabytes: int) -> None:
    chunk = b"y" * 65536
    for _ in range(megabytes * 16):
        sys.stdout.buffer.write(chunk)


def chatty() -> None:
    print("to stdout")
    print("to stderr", file=sys.stderr)
    raise ValueError("failed after talking")


def talk(extra_kb: int = 0) -> str:
    """Writes to both streams (and `extra_kb` KB more to stdout), then succeeds."""
    print("to stdout", flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    sys.stdout.write("z" * (extra_kb * 1024))
    return "talked"


def fail_once(marker: str) -> str:
    """Fails, saying so, the first time (no `marker` file yet); prints and succeeds after."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        print("first run")
        raise ValueError("first run fails")
    print("second run")
    return "second"


def write_nul() -> None:
    sys.stdout.buffer.write(b"a\x00b")


def exit3() -> None:
    os._exit(3)


def segfault() -> None:
    ctypes.string_at(0)


def returns_a_set() -> set:
    return {1, 2}


class UnbuildableError(Exception):
    """An exception whose class exists only in the child and needs arguments to rebuild."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"needs {a} and {b}")


def raises_unbuildable() -> None:
    raise UnbuildableError(1, 2)


def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def size(text: str, extra: dict | None = None) -> int:
    return len(text) + len(extra or {})


def own_cgroups() -> str:
    """The groups it runs in, one line per hierarchy."""
    with open("/proc/self/cgroup") as f:
        return f.read()


def spawn_until_refused(most: int) -> int:
    """Starts `sleep`s until a fork is refused or `most` run: how many it started."""
    started = []
    try:
        while len(started) < most:
            started.append(subprocess.Popen(["sleep", "300"]))
    except OSError:  # EAGAIN: the group's pids.max
        pass
    return len(started)


def peek(pids: list[int]) -> dict:
    """An attack on the daemon's and the zygote's (its parent's) secrets: read each one's
    environment, memory and command line, directly and through a program it runs. What
    each attempt got: "read" or the error's name."""
    out: dict[str, str] = {}
    targets = {"zygote": os.getppid(), **{f"pid {p}": p for p in pids}}
    for who, pid in targets.items():
        for name in ("environ", "mem", "cmdline"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as f:
                    f.read(1)
                out[f"{who} {name}"] = "read"
            except OSError as e:
                out[f"{who} {name}"] = type(e).__name__
        r = subprocess.run(["cat", f"/proc/{pid}/environ"], capture_output=True)
        out[f"{who} environ by cat"] = "read" if r.returncode == 0 else "refused"
    return out


def reach(pids: list[int], paths: list[str], tag: str) -> dict:
    """Attacks on what lies outside the job: signal 0 to each pid (would a kill reach it?),
    a read of each path (a file's first byte, a directory's names), its own pid written to
    each `cgroup.procs` path among them (a move out of its own group), and a file of 1 MB
    left in /dev/shm and in /tmp, named after `tag`. What each got: "done" or the error."""
    out: dict[str, str] = {}
    for pid in pids:
        try:
            os.kill(pid, 0)
            out[f"signal {pid}"] = "done"
        except OSError as e:
            out[f"signal {pid}"] = type(e).__name__
    for path in paths:
        try:
            if path.endswith("cgroup.procs"):
                with open(path, "w") as f:
                    f.write("0")
            elif os.path.isdir(path):
                if not os.listdir(path):
                    raise FileNotFoundError("empty")
            else:
                with open(path, "rb") as f:
                    f.read(1)
            out[path] = "done"
        except OSError as e:
            out[path] = type(e).__name__
    for folder in ("/dev/shm", "/tmp"):
        try:
            with open(os.path.join(folder, f"queickd-left-{tag}"), "wb") as f:
                f.write(b"x" * (1 << 20))
            out[folder] = "done"
        except OSError as e:
            out[folder] = type(e).__name__
    return out


def kill_pid(pid: int) -> str:
    """SIGKILL to `pid` (its zygote's, say): what happened."""
    try:
        os.kill(pid, signal.SIGKILL)
        return "killed"
    except OSError as e:
        return type(e).__name__


def fork_hogs(n: int, mb: int) -> str:
    """Forks `n` children that each touch `mb` MB and wait; once all have, waits up to 20 s
    itself (a memory watch that counts only this process sees nothing) and says so."""
    import select

    r, w = os.pipe()
    hold_r, hold_w = os.pipe()
    for _ in range(n):
        if os.fork() == 0:
            block = b"x" * (mb << 20)
            os.write(w, b"1")
            os.read(hold_r, 1)  # until the parent ends (the pipe closes)
            os._exit(len(block) and 0)
    got = 0
    while got < n:
        got += len(os.read(r, n))
    select.select([hold_r], [], [], 20)
    return "survived"


def fill_shm(mb: int, name: str) -> int:
    """Writes up to `mb` MB into /dev/shm/`name`, 1 MB at a time, then waits up to 20 s:
    the MB it could write."""
    import select

    written = 0
    try:
        with open(f"/dev/shm/{name}", "wb") as f:
            for _ in range(mb):
                f.write(b"y" * (1 << 20))
                f.flush()
                written += 1
    except OSError:
        pass
    select.select([], [], [], 20)
    return written


def ids() -> dict:
    """Who it runs as, and where."""
    return {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "cwd": os.getcwd(),
            "writable": os.access(os.getcwd(), os.W_OK)}


def uncover(paths: list[str]) -> dict:
    """umount2(MNT_DETACH) of each path (what covers it in the job's mount namespace),
    then a read of it as reach() does: what each got, "done" or the error."""
    libc = ctypes.CDLL(None, use_errno=True)
    out: dict[str, str] = {}
    for path in paths:
        if libc.umount2(path.encode(), 2) != 0:
            out[f"umount {path}"] = os.strerror(ctypes.get_errno())
        else:
            out[f"umount {path}"] = "done"
        try:
            if os.path.isdir(path):
                if not os.listdir(path):
                    raise FileNotFoundError("empty")
            else:
                with open(path, "rb") as f:
                    f.read(1)
            out[path] = "done"
        except OSError as e:
            out[path] = type(e).__name__
    return out


def contents(path: str) -> str:
    """The text of the file at `path`, or the error name."""
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        return type(e).__name__
