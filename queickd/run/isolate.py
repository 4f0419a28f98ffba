"""What keeps a process job from the daemon and from the other jobs, beyond its cgroups and
rlimits (docs/explanation/security.md has the table of what holds where):

- the daemon and the zygote made non-dumpable (PR_SET_DUMPABLE 0), so that a process of
  the same user can neither read their /proc files (environ, mem, fds) nor ptrace them;
- PID and mount namespaces per job (enter, probed once by each zygote: probe), with its
  own /proc, /tmp and /dev/shm and the daemon's files covered (hidden_paths);
- another user for the job (--job-user: job_user, checked at start; hand_over, become);
- RLIMIT_NPROC's count (user_tasks) and the /dev/shm a job user leaves (remove_shm).

The daemon calls not_dumpable, hidden_paths, job_user and remove_shm; the zygote
not_dumpable and probe; the job's child (run/child.py, single-threaded) the rest. Never
raises from not_dumpable or probe: a mechanism the kernel refuses is reported as not in
force, with why.
"""

from __future__ import annotations

import ctypes
import os
import sys

from .cgroup_v1 import write as _write

PR_SET_PDEATHSIG = 1
PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36

_libc: list = []  # loaded once, in the zygote: every forked child inherits it


def _call(name: str, *args: object) -> int:
    if not _libc:
        _libc.append(ctypes.CDLL(None, use_errno=True))
    return int(getattr(_libc[0], name)(*args))


def prctl(option: int, value: int = 0) -> int:
    """prctl(2)'s result, or -1 when it cannot be called here."""
    try:
        return _call("prctl", option, value, 0, 0, 0)
    except (OSError, AttributeError):
        return -1


def not_dumpable() -> str | None:
    """Make this process non-dumpable: its /proc files become root's and ptrace(2) of it
    needs CAP_SYS_PTRACE, so a job of the same user cannot read its environment, memory
    or descriptors. None when in force, else why not. Children forked from it inherit
    it; a child that execs a program loses it (the program's own process, not this one)."""
    if prctl(PR_SET_DUMPABLE, 0) != 0 or prctl(PR_GET_DUMPABLE) != 0:
        return f"prctl(PR_SET_DUMPABLE) failed: {os.strerror(ctypes.get_errno()) or 'not available'}"
    return None


# --- namespaces: a process job's own pids and mounts ----------------------------------------
#
# The job's child calls enter() last before job code: new PID and mount namespaces (and,
# when not root, a user namespace mapping its uid to itself), then a fork that is the job:
# pid 1 there, seeing and signalling only its own processes, with a fresh /tmp (its own
# directory bound back) and /dev/shm, and the daemon's files covered (locked for a job that
# is not root: _lock_mounts). The process that forked it ends as it ended (_mirror), so the
# zygote sees the job's own exit status.

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
CGROUP_ROOT = "/sys/fs/cgroup"


def _libc_call(name: str, *args: object) -> None:
    if _call(name, *args) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{name}{tuple(a.decode() if isinstance(a, bytes) else a for a in args[:2])}: "
                         f"{os.strerror(e)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    _libc_call("mount", enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))


def _unshare(flags: int) -> None:
    """unshare(2); with CLONE_NEWUSER, the uid and gid mapped to themselves inside. A
    non-dumpable process's /proc files are root's: it could not write its own maps, so it
    is dumpable for these few calls only (it holds a copy of the zygote, no secret)."""
    uid, gid = os.getuid(), os.getgid()
    if flags & CLONE_NEWUSER:
        prctl(PR_SET_DUMPABLE, 1)
    _libc_call("unshare", flags)
    if flags & CLONE_NEWUSER:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
        prctl(PR_SET_DUMPABLE, 0)


def _new_namespaces() -> None:
    """New PID and mount namespaces; for a process that is not root, inside a user
    namespace of its own (what lets it mount)."""
    _unshare(CLONE_NEWNS | CLONE_NEWPID | (0 if os.geteuid() == 0 else CLONE_NEWUSER))
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here reaches the host


def _mounts(spec: dict, user: tuple[int, int] | None) -> None:
    """In the new namespaces, as their pid 1: /proc, /tmp, /dev/shm, and what is hidden. For
    a job user, its directory in the new /tmp is a copy of the daemon's, the user's: what
    it leaves there goes with the namespace, never into a directory the daemon removes."""
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    nosuid = MS_NOSUID | MS_NODEV
    shm = spec.get("shm_mb")
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", nosuid, "mode=1777" + (f",size={shm}m" if shm else ""))
    tmp, job_dir = spec.get("tmp"), spec.get("job_dir")
    if tmp and job_dir and os.path.isdir(tmp):
        keep = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY)
        code = _code_under(tmp)
        try:
            _mount("tmpfs", tmp, "tmpfs", nosuid, "mode=1777" + (f",size={shm}m" if shm else ""))
            for path, fd in code:  # read-only: what the job imports (a checkout or venv under /tmp)
                os.makedirs(path, exist_ok=True)
                _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
                _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | nosuid)
            if user is None:
                os.makedirs(job_dir, 0o700, exist_ok=True)
                _mount(f"/proc/self/fd/{keep}", job_dir, None, MS_BIND)
            else:
                import shutil

                shutil.copytree(f"/proc/self/fd/{keep}", job_dir)
                os.chmod(job_dir, 0o700)
                hand_over([job_dir], *user)
        finally:
            os.close(keep)
            for _, fd in code:
                os.close(fd)
    for path in spec.get("hide") or ():
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_RDONLY | nosuid | MS_NOEXEC, "size=4k,mode=0555")
        elif os.path.lexists(path):
            _mount("/dev/null", path, None, MS_BIND)
    if job_dir:
        os.chdir(job_dir)


def _code_under(tmp: str) -> list[tuple[str, int]]:
    """The import path's directories that lie under `tmp` (the daemon's own package and the
    app's modules, when a checkout or a venv sits in /tmp), opened before the job's fresh
    tmpfs covers them, to be bound back: a job imports lazily after its namespaces are made
    (asyncio.run, a module a function imports when called)."""
    out: list[tuple[str, int]] = []
    for entry in dict.fromkeys(os.path.realpath(p or ".") for p in sys.path):
        if entry != tmp and os.path.commonpath([tmp, entry]) == tmp and os.path.isdir(entry) \
                and not any(os.path.commonpath([done, entry]) == done for done, _ in out):
            out.append((entry, os.open(entry, os.O_RDONLY | os.O_DIRECTORY)))
    return out


def _lock_mounts() -> None:
    """For a job that is not root: a user namespace (and a mount namespace) nested in the one
    that owns the job's mounts. Its capabilities there covered what _mounts did, and would
    let it unmount /tmp or a covered path and read what is beneath; mounts passed into a
    namespace below their owner's are locked, so in the nested one nothing can be uncovered.
    Same uid and gid inside; the parent-death signal, cleared by the change, set again."""
    _unshare(CLONE_NEWUSER | CLONE_NEWNS)
    prctl(PR_SET_PDEATHSIG, 9)


def enter(spec: dict, user: tuple[int, int] | None = None) -> None:
    """Move the calling (single-threaded) job process into namespaces of its own; returns in
    the job's process (pid 1 there). The caller's own process never returns: it waits for
    the job and exits as it did. Raises OSError when the kernel refuses (in the job's
    process once it has forked: that one reports it as the job's set-up failure)."""
    _new_namespaces()
    pid = os.fork()
    if pid == 0:
        prctl(PR_SET_PDEATHSIG, 9)  # SIGKILL: the job ends with the process the watch kills
        _mounts(spec, user)  # raises into the job's set-up: its report says sandbox_setup
        if os.geteuid() != 0:
            _lock_mounts()
        return
    _mirror(pid)


def _mirror(pid: int) -> None:
    """Wait for the job's process and end as it ended (its exit code, or its signal). A
    SIGTERM (a timeout's) is the job's to act on: this process only follows it, and dies
    with a SIGKILL (the grace's end, a cancel, a limit), which ends the job too."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        _, status = os.waitpid(pid, 0)  # retried by Python itself when a signal interrupts it
    except ChildProcessError:
        os._exit(70)
    try:
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
    finally:  # never back into the job's path
        os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 70)


def probe() -> str | None:
    """Can a job get its own namespaces here? None if so, else why not. Forks (call it in
    a single-threaded process: the zygote, once at its start); the fork does what enter()
    does up to a /proc and a tmpfs of its own and exits."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            _new_namespaces()
            inner = os.fork()
            if inner == 0:  # pid 1 there: an error below is its own, written as the outer one's
                _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
                if os.path.isdir("/dev/shm"):
                    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
                os._exit(0)
            code = 0 if os.waitpid(inner, 0)[1] == 0 else 1
        except BaseException as e:
            os.write(w, str(e).encode()[:500])
            code = 1
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        why = f.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if status == 0:
        return None
    return why or f"the probe ended with status {status}"


def hidden_paths(store_url: str, files: list[str | None], keep: list[str]) -> list[str]:
    """What a job's mount namespace covers: an SQLite store's directory (only its files
    when that directory holds something a job needs: `keep`, the app and job directories),
    the given files (tokens, config, webhook secrets), the daemon's systemd credentials directory, and the
    cgroup hierarchies (a job cannot move itself out of its group through files it cannot
    see). Absolute paths, those that exist now."""
    out: list[str] = []
    if store_url.startswith("sqlite:///"):
        db = os.path.abspath(store_url[len("sqlite:///"):])
        folder = os.path.dirname(db)
        inside = [k for k in keep if os.path.commonpath([folder, os.path.abspath(k)]) == folder]
        out += [db + s for s in ("", "-wal", "-shm", "-journal")] if inside else [folder]
    out += [os.path.abspath(f) for f in files if f]
    creds = os.environ.get("CREDENTIALS_DIRECTORY")
    if creds:
        out.append(creds)
    out.append(CGROUP_ROOT)
    return [p for p in dict.fromkeys(out) if os.path.lexists(p)]


def user_tasks(uid: int) -> int:
    """The processes (threads) of the real user `uid` now, from /proc: what a process of
    that user has its RLIMIT_NPROC counted against."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                status = f.read()
            real = int(status.split(b"\nUid:", 1)[1].split()[0])
            threads = int(status.split(b"\nThreads:", 1)[1].split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if real == uid:
            total += threads
    return total


# --- another user: --job-user -----------------------------------------------------------------

JOB_USER_CAPS = {"CAP_SETUID": 7, "CAP_SETGID": 6, "CAP_CHOWN": 0, "CAP_KILL": 5}  # name -> its bit in CapEff


def job_user(name: str) -> tuple[int, int]:
    """(uid, gid) of the user process jobs run as, or ValueError saying why it cannot be:
    no such user, or this process lacks a capability it needs to switch to it, hand it
    its directory and kill its processes (root has them all)."""
    import pwd

    try:
        entry = pwd.getpwnam(name) if not name.isdigit() else pwd.getpwuid(int(name))
    except KeyError:
        raise ValueError(f"--job-user {name!r}: no such user") from None
    if entry.pw_uid == os.getuid():
        raise ValueError(f"--job-user {name!r} is the daemon's own user: give another one")
    try:
        with open("/proc/self/status") as f:
            eff = int(next(line.split()[1] for line in f if line.startswith("CapEff:")), 16)
    except (OSError, StopIteration, ValueError):
        eff = ~0 if os.geteuid() == 0 else 0
    missing = [cap for cap, bit in JOB_USER_CAPS.items() if not eff >> bit & 1]
    if missing:
        raise ValueError(f"--job-user {name!r}: the daemon lacks {', '.join(missing)} (a systemd unit: "
                         f"AmbientCapabilities= and CapabilityBoundingSet= with them)")
    return entry.pw_uid, entry.pw_gid


def hand_over(paths: list[str], uid: int, gid: int) -> None:
    """The job's directory (and what is in it: its arguments, its credentials) made the
    job user's, before the job's process becomes that user."""
    for top in paths:
        os.chown(top, uid, gid)
        for root, dirs, files in os.walk(top):
            for name in dirs + files:
                os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)


def become(uid: int, gid: int) -> None:
    """This process (the job's, single-threaded) becomes the job user, for good: no
    supplementary groups, no capabilities. A credential change clears the parent-death
    signal: it is set again (the job dies with the process the watch kills)."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    prctl(PR_SET_PDEATHSIG, 9)


def remove_shm(uid: int, folder: str = "/dev/shm") -> list[str]:
    """Remove the files `uid` owns in /dev/shm (a job user's, left by jobs that have ended):
    their names. Directories and other users' files are left alone."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        path = os.path.join(folder, name)
        try:
            st = os.lstat(path)
            if st.st_uid == uid and not os.path.isdir(path):
                os.unlink(path)
                removed.append(name)
        except OSError:
            continue
    return removed
