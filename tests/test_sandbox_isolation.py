"""What a process job can reach of the daemon (issue: a sandboxed job took everything the
daemon's user owns). Each attack is a job in tests/jobs/sandboxjobs.py run through a real
daemon; where the kernel or this test's privileges do not allow a mechanism, the test
skips and says why."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from helpers import let_others_reach_the_checkout

from queickd.core.job import State

# As the user nobody, with this checkout on its import path: an interpreter nobody may run
# has no install of queickd of its own (a venv or pyenv under /root is not nobody's).
SETPRIV = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "env",
           f"PYTHONPATH={os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}"]


def _python_for_nobody() -> str | None:
    """An interpreter (3.11+) the user nobody may run and import queickd with, or None."""
    let_others_reach_the_checkout()
    for python in (sys.executable, "/usr/bin/python3"):
        r = subprocess.run([*SETPRIV, "sh", "-c", f'exec {python} "$@"', "sh", "-c",
                            "import sys, queickd; assert sys.version_info >= (3, 11)"], capture_output=True, cwd="/")
        if r.returncode == 0:
            return python
    return None


@pytest.fixture
def nobody():
    """(a store URL in a directory the user nobody owns, the prefix that starts a daemon as
    nobody on an interpreter it may run)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv, to start a daemon as the user nobody")
    python = _python_for_nobody()
    if python is None:
        pytest.skip("no Python 3.11+ here that the user nobody may run and import queickd with")
    path = tempfile.mkdtemp(prefix="queickd-nobody-")
    os.chown(path, 65534, 65534)
    # DaemonProcess runs sys.executable: the shell puts the interpreter nobody may run in its place.
    yield f"sqlite:///{path}/q.db", [*SETPRIV, "sh", "-c", f'shift; exec {python} "$@"', "sh"], python
    shutil.rmtree(path, ignore_errors=True)


def test_a_process_job_of_the_daemons_user_cannot_read_the_daemons_or_the_zygotes_memory(
        start_daemon, nobody):
    d = start_daemon(nobody[0], "--job-namespaces", "off", prefix=nobody[1])  # the pids can be seen
    with d.client() as q:
        job = q.wait(q.enqueue("sandboxjobs:peek", [[d.proc.pid]], isolation="process"), 30)
    assert job["state"] == State.SUCCEEDED, job
    got = job["result"]
    for who in ("zygote", f"pid {d.proc.pid}"):
        assert got[f"{who} environ"] == got[f"{who} mem"] == "PermissionError", got
        assert got[f"{who} environ by cat"] == "refused", got  # a program the job runs: no better


def test_the_start_log_says_which_sandbox_mechanisms_are_in_force(start_daemon):
    d = start_daemon(None, "--isolation", "process")
    line = d.wait_for_line(r"INFO queickd.sandbox: sandbox: (.*)").group(1)
    assert "non-dumpable daemon yes" in line and "cgroup memory " in line


# --- PID and mount namespaces: a job reaches nothing of the daemon -------------------------------

def _namespaces_or_skip(d) -> None:
    line = d.wait_for_line(r"INFO queickd.sandbox: sandbox: (.*)").group(1)
    if "pid namespace yes" not in line:
        pytest.skip(f"the kernel gives process jobs no namespaces here: {line}")


def _daemon_in(start_daemon, tmp_path, who: str, nobody):
    """A daemon (as root, or as the user nobody) with a token, its store, and the job's
    targets: what reach() must not get to."""
    if who == "root":
        if os.geteuid() != 0:
            pytest.skip("needs root")
        store, prefix, home = None, None, tmp_path
    else:
        store, prefix, python = nobody
        home = os.path.dirname(store[len("sqlite:///"):])
    if who == "unit":
        prefix = _under_the_unit(prefix, python)
    token = os.path.join(home, "token")
    with open(token, "w") as f:
        f.write("s3cret\n")
    os.chmod(token, 0o644)
    if who != "root":
        os.chown(token, 65534, 65534)
    config = os.path.join(home, "q.toml")
    with open(config, "w") as f:
        f.write("workers = 4\n")
    os.chmod(config, 0o644)
    d = start_daemon(store, "--token-file", token, "--isolation", "process", "--config", config, prefix=prefix)
    if who == "unit" and _plain_user_gets_namespaces(python):
        line = d.wait_for_line(r"INFO queickd.sandbox: sandbox: (.*)").group(1)
        assert "pid namespace yes" in line and "mount namespace yes" in line, line
    _namespaces_or_skip(d)
    return d, token, config


UNIT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "systemd", "queickd.service")
UNITFILTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unitfilter.py")


def _under_the_unit(nobody_prefix: list[str], python: str) -> list[str]:
    """The daemon as nobody as the shipped unit would run it, as far as can be had without
    systemd: its SystemCallFilter= and RestrictNamespaces= as a seccomp filter (with
    no_new_privs), in a mount namespace whose /proc is mounted hidepid=invisible
    (ProtectProc=). Not reproduced: ProtectSystem=, PrivateTmp=, PrivateDevices=."""
    if shutil.which("systemd-analyze") is None or shutil.which("unshare") is None:
        pytest.skip("needs systemd-analyze (to expand the unit's syscall groups) and unshare")
    try:
        import ctypes
        ctypes.CDLL("libseccomp.so.2")
    except OSError:
        pytest.skip("needs libseccomp, to install the unit's syscall filter")
    n = len(SETPRIV)
    return ["unshare", "-m", "--propagation", "private", "sh", "-c",
            'mount -t proc -o nosuid,nodev,noexec,hidepid=invisible proc /proc && exec "$@"', "sh",
            *nobody_prefix[:n], python, UNITFILTER, UNIT, *nobody_prefix[n:]]


def _plain_user_gets_namespaces(python: str) -> bool:
    """Does the kernel give the user nobody namespaces here, without the unit's filter?"""
    code = "import sys; from queickd.run import isolate; sys.exit(isolate.probe() is not None)"
    return subprocess.run([*SETPRIV, python, "-c", code], capture_output=True).returncode == 0


@pytest.fixture(params=["root", "nobody", "unit"])
def ns_daemon(request, start_daemon, tmp_path):
    """root, nobody, and nobody under the shipped unit's syscall filter and namespace rules."""
    nobody = request.getfixturevalue("nobody") if request.param != "root" else None
    return _daemon_in(start_daemon, tmp_path, request.param, nobody)


def test_a_job_in_its_namespaces_cannot_signal_see_or_read_the_daemon_its_zygote_or_their_files(ns_daemon):
    d, token, config = ns_daemon
    tag = f"{os.getpid()}-{id(d)}"
    with d.client(token="s3cret") as q:
        zygote = q.stats()["sandbox"]["zygote"]["pid"]
        store = d.store_url[len("sqlite:///"):]
        cgroup_procs = [f"/sys/fs/cgroup/{c}/cgroup.procs" for c in ("memory", "pids", "unified")]
        paths = [token, config, store, os.path.dirname(store), f"/proc/{d.proc.pid}/environ", *cgroup_procs]
        job = q.wait(q.enqueue("sandboxjobs:reach", [[d.proc.pid, zygote], paths, tag]), 30)
        assert job["state"] == State.SUCCEEDED, job
        got = job["result"]
        assert got[f"signal {d.proc.pid}"] == got[f"signal {zygote}"] == "ProcessLookupError", got
        assert got[token] == got[config] == got[store] == got[f"/proc/{d.proc.pid}/environ"] == "FileNotFoundError", got
        assert got[os.path.dirname(store)] in ("FileNotFoundError", "PermissionError"), got
        assert all(got[p] in ("FileNotFoundError", "PermissionError", "OSError") for p in cgroup_procs), got
        # /dev/shm and /tmp were its own, and went with it.
        assert got["/dev/shm"] == got["/tmp"] == "done", got
        assert not os.path.exists(f"/dev/shm/queickd-left-{tag}") and not os.path.exists(f"/tmp/queickd-left-{tag}")
        # A kill of its zygote's pid reaches nothing: the zygote serves on.
        assert q.wait(q.enqueue("sandboxjobs:kill_pid", [zygote]), 30)["result"] == "ProcessLookupError"
        assert q.stats()["sandbox"]["zygote"] == {"alive": True, "pid": zygote, "restarts": 0}
        assert d.proc.poll() is None


def test_a_plain_users_job_cannot_unmount_what_covers_the_daemons_files(start_daemon, tmp_path, nobody):
    d, token, config = _daemon_in(start_daemon, tmp_path, "nobody", nobody)
    store = d.store_url[len("sqlite:///"):]
    # /tmp first: the daemon's files here are under it, beneath the job's own tmpfs.
    paths = ["/tmp", os.path.dirname(store), token, config, store, "/sys/fs/cgroup"]
    with d.client(token="s3cret") as q:
        job = q.wait(q.enqueue("sandboxjobs:uncover", [paths]), 30)
    assert job["state"] == State.SUCCEEDED, job
    got = job["result"]
    assert got["umount /tmp"] != "done" and got["umount /sys/fs/cgroup"] != "done", got
    assert all(got[p] in ("FileNotFoundError", "PermissionError") for p in (token, config, store)), got


def test_a_job_in_its_namespaces_cannot_read_a_webhooks_secret_file(start_daemon, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (a secret outside /tmp, which a job's own tmpfs covers anyway)")
    home = tempfile.mkdtemp(prefix="queickd-hook-", dir="/var/tmp")  # not under the job's own /tmp
    try:
        secret = os.path.join(home, "hook-secret")
        with open(secret, "w") as f:
            f.write("signing key\n")
        os.chmod(secret, 0o600)
        config = tmp_path / "q.toml"
        config.write_text(f'[hooks.push]\nfunc = "testjobs:noop"\nsecret_file = "{secret}"\n')
        d = start_daemon(None, "--isolation", "process", "--config", str(config))
        _namespaces_or_skip(d)
        with d.client() as q:
            job = q.wait(q.enqueue("sandboxjobs:contents", [secret]), 30)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert job["state"] == State.SUCCEEDED, job
    assert job["result"] in ("", "FileNotFoundError", "PermissionError"), job  # covered: /dev/null


def test_a_part_of_proc_covered_by_a_mount_refuses_a_plain_users_job_its_own_proc(nobody):
    """Why the job-running units have no ProtectKernelTunables= or ProtectKernelLogs=: they
    cover /proc/sys (read-only) and /proc/kmsg with mounts, and the kernel then refuses a
    fresh /proc in a user namespace, so the zygote's probe finds no namespaces."""
    if not _plain_user_gets_namespaces(nobody[2]):
        pytest.skip("the kernel gives the user nobody no namespaces here")
    probe = "from queickd.run import isolate; print(isolate.probe())"
    for cover in ("mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys",
                  "mount --bind /dev/null /proc/kmsg"):
        r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", f'{cover} && exec "$@"', "sh",
                            *SETPRIV, nobody[2], "-c", probe], capture_output=True, text=True)
        assert "mount('proc', '/proc'): Operation not permitted" in r.stdout, (cover, r.stdout, r.stderr)

# --- --job-user: jobs as a user that owns nothing of the daemon's ------------------------------

def _own_group_procs(pid: int) -> list[str]:
    """The cgroup.procs files of `pid`'s groups (v1 memory and pids; v2), where they exist."""
    out = []
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            for name, mount in (("memory", "memory"), ("pids", "pids"), ("", "unified")):
                if names == name:
                    procs = os.path.join("/sys/fs/cgroup", mount, path.lstrip("/"), "cgroup.procs")
                    if os.path.exists(procs):
                        out.append(procs)
    return out


@pytest.mark.parametrize("namespaces", ["off", "auto"])
def test_a_job_user_cannot_leave_its_cgroup_read_the_token_or_signal_the_daemon(start_daemon, tmp_path, namespaces):
    if os.geteuid() != 0:
        pytest.skip("needs root (or CAP_SETUID, CAP_SETGID, CAP_CHOWN, CAP_KILL) to run jobs as another user")
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    d = start_daemon(None, "--token-file", str(token), "--job-user", "nobody", "--job-namespaces", namespaces)
    assert "job user yes" in d.wait_for_line(r"INFO queickd.sandbox: sandbox: (.*)").group(1)
    procs = _own_group_procs(d.proc.pid)
    with d.client(token="s3cret") as q:
        who = q.wait(q.enqueue("sandboxjobs:ids", isolation="process"), 30)
        assert who["state"] == State.SUCCEEDED, who
        assert (who["result"]["uid"], who["result"]["groups"], who["result"]["writable"]) == (65534, [], True)
        job = q.wait(q.enqueue("sandboxjobs:reach", [[d.proc.pid], [str(token), *procs], "u"],
                               isolation="process"), 30)
    assert job["state"] == State.SUCCEEDED, job
    got = job["result"]
    assert got[f"signal {d.proc.pid}"] in ("PermissionError", "ProcessLookupError"), got
    assert got[str(token)] in ("PermissionError", "FileNotFoundError"), got
    assert procs and all(got[p] in ("PermissionError", "FileNotFoundError") for p in procs), got
    assert not [p for p in os.listdir("/tmp") if p.startswith("queickd-job-") and f"-{d.proc.pid}-" in p]


def test_a_job_user_that_does_not_exist_is_refused_at_start(tmp_path):
    r = subprocess.run([sys.executable, "-m", "queickd", "run", "--store", "memory://", "--port", "0",
                        "--job-user", "no-such-user-here"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 78 and "--job-user 'no-such-user-here': no such user" in r.stderr, r.stderr


def test_a_job_in_its_namespaces_cannot_see_or_signal_another_running_job(start_daemon, gate):
    d = start_daemon(None, "--isolation", "process")  # the zygote starts at once: the start line knows
    _namespaces_or_skip(d)
    with d.client() as q:
        held = q.enqueue("testjobs:gate", [gate.port, "held"], isolation="process")
        assert gate.arrival() == "held"
        zygote = q.stats()["sandbox"]["zygote"]["pid"]
        with open(f"/proc/{zygote}/task/{zygote}/children") as f:
            others = [int(p) for p in f.read().split()]
        inner = []
        for p in others:  # the held job's own process: the one child of each that follows a job
            with open(f"/proc/{p}/task/{p}/children") as f:
                inner += [int(c) for c in f.read().split()]
        targets = others + inner
        job = q.wait(q.enqueue("sandboxjobs:reach", [targets, [f"/proc/{p}/environ" for p in targets], "o"],
                               isolation="process"), 30)
        gate.release_all("done")
        assert q.wait(held, 30)["state"] == State.SUCCEEDED
    got = job["result"]
    assert targets and all(got[f"signal {p}"] in ("ProcessLookupError", "PermissionError") for p in targets), got
    assert all(got[f"/proc/{p}/environ"] in ("FileNotFoundError", "PermissionError") for p in targets), got


def test_jobs_without_namespaces_are_said_to_have_none_and_why_and_still_run(start_daemon):
    d = start_daemon(None, "--isolation", "process", "--job-namespaces", "off")
    line = d.wait_for_line(r"INFO queickd.sandbox: sandbox: (.*)").group(1)
    assert "pid namespace no (--job-namespaces off)" in line, line
    assert "mount namespace no (--job-namespaces off)" in line, line
    assert d.wait_for_line(r"pid and mount namespaces per job: no \(--job-namespaces off\)")
    with d.client() as q:
        who = q.wait(q.enqueue("sandboxjobs:whoami"), 30)
    assert who["state"] == State.SUCCEEDED and who["result"]["pid"] != 1  # the host's pids


def test_what_a_job_user_leaves_in_the_hosts_dev_shm_is_removed_after_the_job(start_daemon):
    if os.geteuid() != 0 or not os.path.isdir("/dev/shm"):
        pytest.skip("needs root (to run jobs as nobody) and a /dev/shm")
    d = start_daemon(None, "--job-user", "nobody", "--job-namespaces", "off", "--isolation", "process")
    tag = f"{os.getpid()}-shm"
    with d.client() as q:
        job = q.wait(q.enqueue("sandboxjobs:reach", [[], [], tag]), 30)
    assert job["result"]["/dev/shm"] == "done", job
    # Gone by the time the job's outcome is stored (another test's daemon with the same job
    # user may be the one that removed it: the log line is not asserted).
    assert not os.path.exists(f"/dev/shm/queickd-left-{tag}")


def test_a_job_imports_what_lies_under_tmp_after_its_namespaces_are_made(start_daemon, tmp_path):
    """A checkout, a venv or an app directory under /tmp stays importable: the job's own
    /tmp covers the host's, and a job imports lazily (a module its function imports when
    called, asyncio.run's), after its namespaces are made."""
    app = tmp_path / "app"  # under /tmp
    app.mkdir()
    (app / "lazyjob.py").write_text("def f():\n    import lazyhelper\n\n    return lazyhelper.X\n")
    (app / "lazyhelper.py").write_text("X = 42\n")
    d = start_daemon(None, "--app-dir", str(app), "--isolation", "process")
    _namespaces_or_skip(d)
    with d.client() as q:
        job = q.wait(q.enqueue("lazyjob:f"), 30)
    assert (job["state"], job["result"]) == (State.SUCCEEDED, 42), job
