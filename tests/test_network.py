"""Network-return replay: jobs that need the network wait for it, durably, and run once."""

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
from helpers import DaemonProcess, Listener, read_lines

from queickd.core.job import State
from queickd.services.netcheck import parse_target

UP = re.compile(r"network is up")
DOWN = re.compile(r"network is down")


@pytest.fixture
def internet():
    """What the checker probes."""
    net = Listener()
    yield net
    net.close()


@pytest.fixture
def slack():
    """What the jobs talk to."""
    s = Listener()
    yield s
    s.close()


def start(url: str, internet: Listener, *extra: str, workers: int = 1) -> DaemonProcess:
    return DaemonProcess(url, "--ping-host", f"127.0.0.1:{internet.port}", "--ping-interval", "0.1",
                         *extra, workers=workers).start()


def post(q, slack, out, token, **kw):
    return q.enqueue("testjobs:post", args=(slack.port, str(out), token), retry=True, max_attempts=2,
                     retry_on_network_available=True, **kw)


def test_network_jobs_park_while_down_and_replay_once_in_order(tmp_path, db_url, internet, slack):
    out = tmp_path / "posted.txt"
    d = start(db_url, internet)
    try:
        d.wait_for_line(UP)
        with d.client() as q:
            internet.close()
            d.wait_for_line(DOWN)
            ids = [post(q, slack, out, str(n)) for n in (1, 2, 3)]
            for job_id in ids:
                job = q.wait(job_id, 20, states=[State.WAITING_NETWORK])
                assert job["attempts"] == 0 and job["started_at"] is None  # never started
            assert q.stats()["network"]["state"] == "down"
            assert q.stats()["network"]["down_since"] is not None

            internet.open()
            for job_id in ids:
                assert q.wait(job_id, 30)["state"] == State.SUCCEEDED
            assert [q.get(i)["attempts"] for i in ids] == [1, 1, 1]
        assert read_lines(out) == ["1", "2", "3"]
    finally:
        d.close()


def test_jobs_listed_as_waiting_network(tmp_path, db_url, internet, slack):
    d = start(db_url, internet)
    try:
        d.wait_for_line(UP)
        internet.close()
        d.wait_for_line(DOWN)
        with d.client() as q:
            job_id = post(q, slack, tmp_path / "x", "a")
            q.wait(job_id, 20, states=[State.WAITING_NETWORK])
        r = subprocess.run([sys.executable, "-m", "queickd", "jobs", "--state", "waiting_network",
                            "--port", str(d.port)], capture_output=True, text=True, timeout=30)
        assert str(job_id) in r.stdout and "waiting_network" in r.stdout
        stats = subprocess.run([sys.executable, "-m", "queickd", "stats", "--port", str(d.port)],
                               capture_output=True, text=True, timeout=30).stdout
        assert "network: down" in stats and "waiting_network 1" in stats
    finally:
        d.close()


def test_a_killed_checker_is_restarted_and_replay_still_works(tmp_path, db_url, internet, slack):
    out = tmp_path / "posted.txt"
    d = start(db_url, internet)
    try:
        d.wait_for_line(UP)
        with d.client() as q:
            pid = q.stats()["network"]["checker_pid"]
            os.kill(pid, signal.SIGKILL)
            d.wait_for_line(rf"network checker \(pid {pid}\) exited")
            d.wait_for_line(rf"network checker started \(pid (?!{pid}\b)\d+")
            internet.close()
            d.wait_for_line(DOWN)
            net = q.stats()["network"]
            assert net["checker_alive"] and net["checker_pid"] != pid and net["restarts"] == 1
            job_id = post(q, slack, out, "after-restart")
            q.wait(job_id, 20, states=[State.WAITING_NETWORK])
            internet.open()
            assert q.wait(job_id, 30)["state"] == State.SUCCEEDED
        assert read_lines(out) == ["after-restart"]
    finally:
        d.close()


def test_parked_jobs_survive_a_daemon_restart(tmp_path, db_url, internet, slack):
    out = tmp_path / "posted.txt"
    d = start(db_url, internet)
    d.wait_for_line(UP)
    internet.close()
    d.wait_for_line(DOWN)
    with d.client() as q:
        ids = [post(q, slack, out, str(n)) for n in range(3)]
        for job_id in ids:
            q.wait(job_id, 20, states=[State.WAITING_NETWORK])
    assert d.terminate() == 0

    d2 = start(db_url, internet)
    try:
        d2.wait_for_line(DOWN)  # a new daemon waits for the checker's word
        with d2.client() as q:
            assert [q.get(i)["state"] for i in ids] == [State.WAITING_NETWORK] * 3
            internet.open()
            for job_id in ids:
                assert q.wait(job_id, 30)["state"] == State.SUCCEEDED
        assert read_lines(out) == ["0", "1", "2"]
    finally:
        d2.close()


def test_network_jobs_do_not_start_before_the_checker_has_spoken(tmp_path, db_url, slack):
    # The checker probes a port where nothing listens: it reports "down" first, and no
    # network job may have started before that.
    closed = Listener()
    closed.close()
    d = DaemonProcess(db_url, "--ping-host", f"127.0.0.1:{closed.port}", workers=1).start()
    try:
        with d.client() as q:
            job_id = post(q, slack, tmp_path / "x", "early")
            d.wait_for_line(DOWN)
            job = q.wait(job_id, 20, states=[State.WAITING_NETWORK])
            assert job["started_at"] is None and job["attempts"] == 0
    finally:
        d.close()


def test_without_a_checker_network_jobs_follow_their_retry_policy(daemon, slack, tmp_path):
    slack.close()
    with daemon.client() as q:
        ids = [post(q, slack, tmp_path / "x", str(n)) for n in range(2)]
        jobs = [q.wait(i, 30) for i in ids]
    assert [(j["state"], j["attempts"]) for j in jobs] == [(State.DEAD, 2)] * 2
    warnings = [line for line in daemon.lines if "no checker is configured" in line]
    assert len(warnings) == 1


def test_a_network_job_whose_own_server_is_gone_while_the_network_is_up_ends_dead(db_url, internet, slack, tmp_path):
    # Not parked and released at every sweep for ever: its runs are spent (ten at least).
    slack.close()
    d = start(db_url, internet, "--sweep", "1")
    try:
        d.wait_for_line(UP)
        with d.client() as q:
            job = q.wait(q.enqueue("testjobs:post", args=(slack.port, str(tmp_path / "x"), "t"), retry=True,
                                   retry_type="constant", retry_interval=0.05, max_attempts=2,
                                   retry_on_network_available=True), 30)
        assert (job["state"], job["attempts"], job["error"]["type"]) == (State.DEAD, 10, "ConnectionRefusedError")
    finally:
        d.close()


def test_a_non_network_failure_follows_the_retry_policy_even_with_a_checker(db_url, internet):
    d = start(db_url, internet)
    try:
        d.wait_for_line(UP)
        with d.client() as q:
            job = q.wait(q.enqueue("testjobs:fail", retry=True, retry_type="count_increasing",
                                   max_attempts=2, retry_on_network_available=True), 30)
        assert (job["state"], job["attempts"], job["error"]["type"]) == (State.DEAD, 2, "ValueError")
    finally:
        d.close()


@pytest.mark.parametrize("target,expected", [
    ("example.org", ("tcp", "example.org", 80)),
    ("10.0.0.1:8443", ("tcp", "10.0.0.1", 8443)),
    ("[::1]:9", ("tcp", "::1", 9)),
    ("icmp://gateway", ("icmp", "gateway", None)),
])
def test_ping_targets(target, expected):
    assert parse_target(target) == expected


def test_a_bad_ping_target_is_a_configuration_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "queickd", "run", "--port", "0", "--ping-host", "host:99999",
                        "--store", f"sqlite:///{tmp_path / 'q.db'}"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 78 and "ping target" in r.stderr


@pytest.mark.skipif(shutil.which("ping") is None, reason="the system 'ping' command is not installed")
def test_icmp_probes_use_the_system_ping(db_url):
    d = DaemonProcess(db_url, "--ping-host", "icmp://127.0.0.1", "--ping-interval", "0.5").start()
    try:
        d.wait_for_line(UP)
    finally:
        d.close()


def _can_make_netns() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create a network namespace"
    if shutil.which("ip") is None:
        return "needs iproute2's 'ip' command"
    r = subprocess.run(["ip", "netns", "add", "qd-probe"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns does not work here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", "qd-probe"], capture_output=True)
    return None


@pytest.fixture
def veth_host():
    """A test host in its own network namespace behind a veth pair, with a TCP listener.
    Yields (address, port, host-side link name)."""
    reason = _can_make_netns()
    if reason:
        pytest.skip(reason)
    ns, here, there = f"qd-{os.getpid()}", f"qdv{os.getpid() % 100000}a", f"qdv{os.getpid() % 100000}b"
    local, peer = "10.213.77.1", "10.213.77.2"  # only inside the namespace this test makes

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    listener = None
    try:
        ip("netns", "add", ns)
        ip("link", "add", here, "type", "veth", "peer", "name", there)
        ip("link", "set", there, "netns", ns)
        ip("addr", "add", f"{local}/30", "dev", here)
        ip("link", "set", here, "up")
        ip("netns", "exec", ns, "ip", "addr", "add", f"{peer}/30", "dev", there)
        ip("netns", "exec", ns, "ip", "link", "set", there, "up")
        ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        code = (f"import socket\ns=socket.create_server(('{peer}', 0))\n"
                "print(s.getsockname()[1], flush=True)\n"
                "while True:\n    c,_=s.accept(); c.close()\n")
        listener = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code],
                                    stdout=subprocess.PIPE, text=True)
        port = int(listener.stdout.readline())
        yield peer, port, here
    finally:
        if listener is not None:
            listener.kill()
            listener.wait(10)
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_a_real_link_going_down_and_up_parks_and_replays(veth_host, db_url, tmp_path):
    peer, port, link = veth_host
    out = tmp_path / "posted.txt"
    d = DaemonProcess(db_url, "--ping-host", f"{peer}:{port}", "--ping-interval", "0.2", workers=1).start()
    try:
        d.wait_for_line(UP)
        subprocess.run(["ip", "link", "set", link, "down"], check=True)
        d.wait_for_line(DOWN)
        with d.client() as q:
            job_id = q.enqueue("testjobs:post_to", args=(peer, port, str(out), "over-veth"),
                               retry_on_network_available=True)
            assert q.wait(job_id, 20, states=[State.WAITING_NETWORK])["started_at"] is None
            subprocess.run(["ip", "link", "set", link, "up"], check=True)
            assert q.wait(job_id, 30)["state"] == State.SUCCEEDED
        assert read_lines(out) == ["over-veth"]
    finally:
        d.close()
