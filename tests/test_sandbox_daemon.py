"""Sandboxed runs through a real daemon (and `queick worker` on PostgreSQL): process jobs
by job field, function table and daemon flag; their limits; what stats, /metrics and
`queick show` say; the bad input refused."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from fleethelpers import WorkerProcess
from helpers import JOBS_DIR
from httphelpers import scrape, start_web

from queickd.cli import EX_CONFIG
from queickd.core.job import State
from queickd.core.protocol import QueueError


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_a_job_with_a_timeout_is_killed_dead_and_the_next_job_runs(daemon, client):
    job = client.wait(client.enqueue("sandboxjobs:spin", timeout=1), 20)
    assert (job["state"], job["error"]["type"]) == (State.DEAD, "timeout")
    nxt = client.wait(client.enqueue("sandboxjobs:whoami", isolation="process"), 20)
    assert nxt["state"] == State.SUCCEEDED and nxt["result"]["pid"] != daemon.proc.pid


def test_a_timeout_is_retried_like_any_failure(client):
    job_id = client.enqueue("sandboxjobs:spin", timeout=0.5, retry=True, retry_type="constant",
                            retry_interval=0.1, max_attempts=2)
    job = client.wait(job_id, 20)
    assert (job["state"], job["attempts"], job["error"]["type"]) == (State.DEAD, 2, "timeout")


def test_a_memory_hog_is_killed_and_the_daemons_memory_does_not_grow(daemon, client):
    client.wait(client.enqueue("sandboxjobs:noop", isolation="process"), 20)  # the zygote is up
    before = _rss(daemon.proc.pid)
    job = client.wait(client.enqueue("sandboxjobs:hog", memory_mb=64), 30)
    assert (job["state"], job["error"]["type"]) == (State.DEAD, "memory_limit")
    assert _rss(daemon.proc.pid) < before + (20 << 20)


def test_100_mb_of_stdout_is_cut_at_the_cap_and_the_daemon_answers_meanwhile(client, daemon):
    job_id = client.enqueue("sandboxjobs:flood", [100], output_kb=64 * 1024)
    acks = []
    with daemon.client() as other:
        while client.get(job_id)["state"] in (State.QUEUED, State.RUNNING) and len(acks) < 50:
            t = time.monotonic()
            other.enqueue("testjobs:noop")
            acks.append(time.monotonic() - t)
    job = client.wait(job_id, 30)
    assert (job["state"], job["error"]["type"]) == (State.DEAD, "output_limit")
    assert acks and max(acks) < 0.5
    assert job["output"].startswith("y" * 100) and len(job["output"]) < 70 * 1024


def test_queick_show_prints_a_failed_process_jobs_output(client, daemon):
    job_id = client.wait(client.enqueue("sandboxjobs:chatty", isolation="process"), 20)["id"]
    out = subprocess.run([sys.executable, "-m", "queickd", "show", str(job_id), "--port", str(daemon.port)],
                         capture_output=True, text=True, timeout=30)
    assert "output:" in out.stdout and "to stderr" in out.stdout and "ValueError" in out.stdout


def test_the_daemon_keeps_its_secrets_from_a_process_job(start_daemon, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    d = start_daemon(None, "--token-file", str(token), "--isolation", "process", "--sandbox-env", "APP_MODE",
                     env={"AWS_SECRET_ACCESS_KEY": "aws", "QUEICKD_TOKEN": "s3cret", "APP_MODE": "edge"})
    with d.client(token="s3cret") as q:
        job = q.wait(q.enqueue("sandboxjobs:whoami"), 20)
    env = job["result"]["env"]
    assert env["APP_MODE"] == "edge"
    assert not {"AWS_SECRET_ACCESS_KEY", "QUEICKD_TOKEN"} & env.keys()
    assert "s3cret" not in repr(env) and str(tmp_path) not in repr(env) and "sqlite" not in repr(env)
    assert not os.path.exists(job["result"]["cwd"])


def test_a_function_table_in_the_config_file_sends_its_jobs_to_a_process(start_daemon, tmp_path):
    path = tmp_path / "q.toml"
    path.write_text('[functions."sandboxjobs:spin"]\ntimeout = 0.5\n'
                    '[functions."sandboxjobs:whoami"]\nisolation = "process"\n')
    d = start_daemon(None, "--config", str(path))
    with d.client() as q:
        assert q.wait(q.enqueue("sandboxjobs:spin"), 20)["error"]["type"] == "timeout"
        assert q.wait(q.enqueue("sandboxjobs:whoami"), 20)["result"]["pid"] != d.proc.pid
        assert q.wait(q.enqueue("sandboxjobs:whoami", isolation="thread"), 20)["result"]["pid"] == d.proc.pid


def test_the_zygote_killed_with_sigkill_is_restarted_and_stats_count_it(daemon, client):
    client.wait(client.enqueue("sandboxjobs:noop", isolation="process"), 20)
    zygote = client.stats()["sandbox"]["zygote"]
    assert zygote["alive"]
    os.kill(zygote["pid"], signal.SIGKILL)
    daemon.wait_for_line(r"zygote \(pid \d+\) died")
    job = client.wait(client.enqueue("sandboxjobs:noop", isolation="process"), 20)
    assert job["state"] == State.SUCCEEDED
    sb = client.stats()["sandbox"]
    assert sb["zygote"]["restarts"] == 1 and sb["zygote"]["alive"] and sb["zygote"]["pid"] != zygote["pid"]


def test_sighup_makes_process_jobs_reimport_the_app(daemon, client):
    client.wait(client.enqueue("sandboxjobs:noop", isolation="process"), 20)
    first = client.stats()["sandbox"]["zygote"]["pid"]
    daemon.proc.send_signal(signal.SIGHUP)
    daemon.wait_for_line(r"zygote reload \(SIGHUP\): \d+ module\(s\) imported afresh")
    assert client.wait(client.enqueue("sandboxjobs:noop", isolation="process"), 20)["state"] == State.SUCCEEDED
    assert client.stats()["sandbox"]["zygote"]["pid"] == first  # in place: the same zygote


def test_metrics_count_runs_by_isolation_and_limit_kills_by_kind(start_daemon, tmp_path):
    web = start_web(start_daemon, tmp_path)
    with web.daemon.client() as q:
        q.wait(q.enqueue("testjobs:noop"), 20)
        q.wait(q.enqueue("sandboxjobs:spin", timeout=0.3), 20)
        q.wait(q.enqueue("sandboxjobs:exit3", isolation="process"), 20)
    m = scrape(web)
    assert m[("queickd_runs_total", (("isolation", "thread"),))] == 1
    assert m[("queickd_runs_total", (("isolation", "process"),))] == 2
    assert m[("queickd_limit_kills_total", (("kind", "timeout"),))] == 1
    assert m[("queickd_limit_kills_total", (("kind", "memory_limit"),))] == 0
    assert m[("queickd_process_crashes_total", ())] == 1
    assert m[("queickd_zygote_up", ())] == 1 and m[("queickd_zygote_restarts_total", ())] == 0
    assert 'data-metric="sandbox"' in web.get("/").body.decode()


@pytest.mark.parametrize("fields, message", [
    ({"isolation": "container"}, "isolation must be one of"),
    ({"timeout": 0}, "timeout must be"),
    ({"timeout": 90000}, "timeout must be"),
    ({"memory_mb": 8}, "memory_mb must be"),
    ({"output_kb": -1}, "output_kb must be"),
    ({"isolation": "thread", "memory_mb": 64}, "runs in a process"),
    ({"isolation": "thread", "output_kb": 64}, "runs in a process"),
])
def test_bad_sandbox_fields_are_a_bad_request(client, fields, message):
    with pytest.raises(QueueError) as e:
        client.enqueue("sandboxjobs:noop", **fields)
    assert e.value.code == "bad_request" and message in e.value.message


@pytest.mark.parametrize("text, message", [
    ('[functions."sandboxjobs:noop"]\nisolation = "vm"\n', "isolation must be one of"),
    ('[functions."sandboxjobs:noop"]\nmemory_mb = 4\n', "memory_mb must be"),
    ('[functions."sandboxjobs:noop"]\nisolation = "thread"\nmemory_mb = 64\n', "runs in a process"),
    ('[functions."sandboxjobs:noop"]\nnice = 3\n', "unknown key"),
    ('isolation = "thread"\ntimeout = 3\n', "run in a process"),
])
def test_a_bad_sandbox_setting_in_the_config_file_exits_78(tmp_path, text, message):
    path = tmp_path / "q.toml"
    path.write_text(f'store = "memory://"\nport = 0\napp-dir = "{JOBS_DIR}"\n{text}')
    r = subprocess.run([sys.executable, "-m", "queickd", "--config", str(path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == EX_CONFIG and message in r.stderr


CREDENTIAL_TABLE = '[functions."sandboxjobs:whoami"]\nisolation = "process"\ncredentials = ["s3-key"]\n'


@pytest.mark.parametrize("creds_dir, why", [
    (None, "$CREDENTIALS_DIRECTORY is not set"),
    ("empty", "no such file in $CREDENTIALS_DIRECTORY"),
], ids=["outside-systemd", "not-loaded-by-the-unit"])
def test_unknown_credential_is_refused_at_start(tmp_path, creds_dir, why):
    path = tmp_path / "q.toml"
    path.write_text(f'store = "memory://"\nport = 0\napp-dir = "{JOBS_DIR}"\n{CREDENTIAL_TABLE}')
    env = {k: v for k, v in os.environ.items() if k != "CREDENTIALS_DIRECTORY"}
    if creds_dir is not None:
        (tmp_path / creds_dir).mkdir()
        env["CREDENTIALS_DIRECTORY"] = str(tmp_path / creds_dir)
    r = subprocess.run([sys.executable, "-m", "queickd", "--config", str(path)], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == EX_CONFIG, r.stderr
    assert "functions.\"sandboxjobs:whoami\": credential 's3-key'" in r.stderr and why in r.stderr
    assert "LoadCredential=s3-key:" in r.stderr


def test_a_credential_the_daemon_has_reaches_its_functions_process_jobs(start_daemon, tmp_path):
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "s3-key").write_text("AKIA")
    path = tmp_path / "q.toml"
    path.write_text(CREDENTIAL_TABLE)
    d = start_daemon(None, "--config", str(path), env={"CREDENTIALS_DIRECTORY": str(tmp_path / "creds")})
    with d.client() as q:
        job = q.wait(q.enqueue("sandboxjobs:whoami"), 20)
    assert job["state"] == State.SUCCEEDED, job["error"]
    own = job["result"]["env"]["CREDENTIALS_DIRECTORY"]
    assert own.startswith(job["result"]["cwd"]) and own != str(tmp_path / "creds")


def test_a_process_job_on_queick_worker_obeys_the_same_limits(pg_fresh_database, start_daemon):
    url = pg_fresh_database
    d = start_daemon(url, "--heartbeat", "0.5", workers=0)
    w = WorkerProcess(url).start()
    try:
        with d.client() as q:
            spun = q.wait(q.enqueue("sandboxjobs:spin", timeout=1), 30)
            hog = q.wait(q.enqueue("sandboxjobs:hog", memory_mb=64), 30)
            who = q.wait(q.enqueue("sandboxjobs:whoami", isolation="process"), 30)
        assert spun["error"]["type"] == "timeout" and hog["error"]["type"] == "memory_limit"
        assert who["result"]["pid"] not in (w.pid, d.proc.pid) and "postgresql" not in repr(who["result"]["env"])
    finally:
        w.close()


def test_queick_enqueue_takes_the_limits_as_flags(daemon):
    out = subprocess.run([sys.executable, "-m", "queickd", "enqueue", "sandboxjobs:spin", "--timeout", "0.5",
                          "--wait", "20", "--json", "--port", str(daemon.port)],
                         capture_output=True, text=True, timeout=60)
    job = json.loads(out.stdout)
    assert out.returncode == 1 and job["error"]["type"] == "timeout" and job["timeout"] == 0.5


def _process_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")  # a zombie has ended
    except FileNotFoundError:
        return True


def test_cancelling_a_running_process_job_kills_it_and_what_it_started(start_daemon, tmp_path):
    # In the daemon's namespaces: the pids the job writes are this test's to look for.
    client = start_daemon(None, "--job-namespaces", "off").client()
    pidfile = tmp_path / "pids"
    job_id = client.enqueue("sandboxjobs:spawn_and_hang", [str(pidfile)], isolation="process")
    deadline = time.monotonic() + 20
    while not (pidfile.exists() and pidfile.read_text().endswith("\n")):
        assert time.monotonic() < deadline, "the job never started its children"
        time.sleep(0.05)
    pids = [int(p) for p in pidfile.read_text().split()]
    client.cancel(job_id)
    assert client.get(job_id)["state"] == State.CANCELLED
    while not all(_process_gone(p) for p in pids):
        assert time.monotonic() < deadline, "the cancelled job's processes are still alive"
        time.sleep(0.05)
    after = client.wait(client.enqueue("sandboxjobs:noop", isolation="process"), 20)
    assert after["state"] == State.SUCCEEDED and client.get(job_id)["state"] == State.CANCELLED


# --- how memory limits hold here: one description in stats, /metrics, the page and the log ---

_READ_ONLY_CGROUPS = ["unshare", "--mount", "sh", "-c",
                      'for m in $(findmnt -rn -t cgroup,cgroup2 -o TARGET); do mount -o remount,bind,ro "$m" '
                      '|| exit 1; done; exec "$@"', "sh"]


def test_stats_metrics_the_page_and_the_start_log_say_how_memory_limits_hold(start_daemon, tmp_path):
    from queickd.run import cgroup
    expected = cgroup.means(cgroup.JobCgroups.find(), cgroup.JobCgroups.reason)["memory"]
    web = start_web(start_daemon, tmp_path)
    with web.daemon.client() as q:
        lim = q.stats()["sandbox"]["limits"]
    assert lim["memory"] == expected
    if expected == "RSS watch":
        assert lim["reason"] and lim["pids_max"] is None and not lim["groups"]
    else:
        assert lim["reason"] is None and lim["pids_max"] == cgroup.PIDS_MAX
        assert lim["groups"] and all(os.path.isdir(g) for g in lim["groups"])
    web.daemon.wait_for_line("process jobs: memory limits by")  # the log is read as it comes
    logged = [line for line in web.daemon.lines if "process jobs: memory limits by" in line]
    assert len(logged) == 1 and f"memory limits by {expected}" in logged[0]
    assert scrape(web)[("queickd_memory_limits_info", (("by", expected),))] == 1
    assert f"memory limits by {expected}" in web.get("/").body.decode()


def test_where_no_cgroup_can_be_made_stats_say_rss_watch_and_why_and_it_still_holds(start_daemon):
    if os.geteuid() != 0 or not all(shutil.which(c) for c in ("unshare", "findmnt")):
        pytest.skip("needs root, unshare and findmnt, to start a daemon whose cgroup mounts are read-only")
    if subprocess.run([*_READ_ONLY_CGROUPS, "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot make a mount namespace with read-only cgroup mounts here")
    d = start_daemon(None, prefix=_READ_ONLY_CGROUPS)
    with d.client() as q:
        lim = q.stats()["sandbox"]["limits"]
        assert lim["memory"] == "RSS watch" and "Read-only file system" in lim["reason"], lim
        job = q.wait(q.enqueue("sandboxjobs:hog", memory_mb=64), 30)
    assert (job["state"], job["error"]["type"]) == (State.DEAD, "memory_limit")
    assert any("memory limits by RSS watch (no per-job cgroup:" in line for line in d.lines)


# --- the per-job groups of a daemon killed with SIGKILL: killed and removed at the next start ---

_JOIN = ["sh", "-c", 'for g in $JOIN_GROUPS; do echo $$ > "$g/cgroup.procs" || exit 1; done; exec "$@"', "sh"]


@pytest.fixture
def private_groups(start_daemon):
    """start(): a daemon in groups of its own, one under each base of this host's per-job
    groups, and those groups' paths: what it sweeps is there, out of reach of the daemons
    other tests start meanwhile (each sweeps the groups of dead pids it can see)."""
    from queickd.run import cgroup
    found = cgroup.JobCgroups.find()
    if found is None:
        pytest.skip(f"no per-job cgroup here: {cgroup.JobCgroups.reason}")
    bases = sorted(set(found.bases.values())) if hasattr(found, "bases") else [found.base]
    mine = [os.path.join(b, f"test-{os.getpid()}-{time.monotonic_ns()}") for b in bases]
    for path in mine:
        os.mkdir(path)
    started = []

    def start():
        d = start_daemon(None, "--job-namespaces", "off", prefix=_JOIN, env={"JOIN_GROUPS": " ".join(mine)})
        started.append(d)
        return d

    yield start, mine
    for d in started:
        d.close()
    for path in mine:  # v2: the daemon's own leaf inside too
        for _ in range(200):
            try:
                for name in os.listdir(path):
                    if os.path.isdir(os.path.join(path, name)):
                        os.rmdir(os.path.join(path, name))
                os.rmdir(path)
                break
            except OSError:
                time.sleep(0.01)


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_the_groups_of_a_daemon_killed_with_sigkill_are_emptied_and_removed_at_start(private_groups):
    start_daemon, bases = private_groups
    stale, live = f"job-7-{_dead_pid()}-1", f"job-8-{os.getpid()}-1"
    sleeper = None
    try:
        for base in bases:
            os.mkdir(os.path.join(base, stale))
            os.mkdir(os.path.join(base, live))
        # What a job of the dead daemon left: a process of its own session, in its groups.
        sleeper = subprocess.Popen(["sleep", "300"], start_new_session=True)
        for base in bases:
            with open(os.path.join(base, stale, "cgroup.procs"), "w") as f:
                f.write(str(sleeper.pid))
        d = start_daemon()
        d.wait_for_line(rf"removed the cgroup {stale} left behind by a daemon that is gone, killing 1 process")
        assert sleeper.wait(10) == -signal.SIGKILL
        assert not any(os.path.exists(os.path.join(b, stale)) for b in bases)
        assert all(os.path.isdir(os.path.join(b, live)) for b in bases)  # its pid lives: not touched
        assert not [line for line in d.lines if live in line]
        with d.client() as q:  # and process jobs run as before
            assert q.wait(q.enqueue("sandboxjobs:noop", isolation="process"), 20)["state"] == State.SUCCEEDED
    finally:
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        for base in bases:
            for name in (stale, live):
                path = os.path.join(base, name)
                if os.path.isdir(path):
                    os.rmdir(path)


def test_a_daemon_killed_with_sigkill_mid_job_has_its_jobs_groups_removed_by_the_next(private_groups, tmp_path):
    start_daemon, bases = private_groups
    pidfile = tmp_path / "pids"
    first = start_daemon()
    with first.client() as q:
        job_id = q.enqueue("sandboxjobs:spawn_and_hang", [str(pidfile)], memory_mb=256)  # a group in each
    deadline = time.monotonic() + 20
    while not (pidfile.exists() and pidfile.read_text().endswith("\n")):
        assert time.monotonic() < deadline, "the job never started its children"
        time.sleep(0.05)
    name = f"job-{job_id}-{first.proc.pid}-1"
    assert all(os.path.isdir(os.path.join(b, name)) for b in bases)
    pids = [int(p) for p in pidfile.read_text().split()]
    pidfile.unlink()
    first.kill()
    second = start_daemon()
    second.wait_for_line(rf"removed the cgroup {name} left behind by a daemon that is gone")
    assert not any(os.path.exists(os.path.join(b, name)) for b in bases)
    while not all(_process_gone(p) for p in pids):
        assert time.monotonic() < deadline, "the killed daemon's job processes are still alive"
        time.sleep(0.05)
    # Re-queued as an orphan, it runs again: cancelled once it runs, it leaves nothing behind.
    while not (pidfile.exists() and pidfile.read_text().endswith("\n")):
        assert time.monotonic() < deadline + 20, "the re-queued job never started"
        time.sleep(0.05)
    with second.client() as q:
        q.cancel(job_id)
    assert second.terminate() == 0


# --- the job directories of a daemon killed with SIGKILL: removed at the next start ---

def _job_dirs(tmp) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("queickd-job-"))


def test_the_job_directories_of_a_daemon_killed_with_sigkill_are_removed_at_the_next_start(
        start_daemon, tmp_path, gate):
    tmp = tmp_path / "tmp"  # the daemons' TMPDIR: what they sweep is this test's alone
    tmp.mkdir()
    first = start_daemon(None, env={"TMPDIR": str(tmp)})
    with first.client() as q:
        job_id = q.enqueue("testjobs:gate", [gate.port, "held"], isolation="process")
    assert gate.arrival() == "held"  # it runs in its directory
    left = f"queickd-job-{job_id}-{first.proc.pid}-1"
    assert _job_dirs(tmp) == [left]
    first.kill()
    second = start_daemon(None, env={"TMPDIR": str(tmp)})
    second.wait_for_line(rf"removed the job directory \S*/{left} left behind by a daemon that is gone")
    assert not (tmp / left).exists()


def test_the_start_sweep_leaves_a_live_daemons_job_directory_and_anything_named_otherwise(
        start_daemon, tmp_path):
    tmp, dead = tmp_path / "tmp", _dead_pid()
    tmp.mkdir()
    stale = tmp / f"queickd-job-7-{dead}-1"
    kept = [tmp / f"queickd-job-8-{os.getpid()}-1", tmp / f"queickd-job-9-{dead}-x1",
            tmp / f"queickd-job-{dead}", tmp / f"app-queickd-job-10-{dead}-1"]
    for d in (stale, *kept):
        d.mkdir()
        (d / "f").write_text("x")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "f").write_text("x")
    link = tmp / f"queickd-job-11-{dead}-1"
    link.symlink_to(elsewhere)
    plain = tmp / f"queickd-job-12-{dead}-1"
    plain.write_text("x")
    d = start_daemon(None, env={"TMPDIR": str(tmp)})
    d.wait_for_line("process jobs: memory limits by")  # logged once the sweep is done
    assert not stale.exists()
    assert all((k / "f").exists() for k in kept)
    assert link.is_symlink() and (elsewhere / "f").exists() and plain.read_text() == "x"
