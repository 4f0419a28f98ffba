"""A restart on a full disk: the daemon starts read-only, says "disk full", serves reads,
refuses writes with an error naming the disk, and accepts writes again once space returns.
A real full file system: a 2 MiB tmpfs, filled up (mounting needs root; skipped otherwise)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from helpers import STARTED, DaemonProcess, Gate

from queickd.core.protocol import QueueError

WAITING = 20


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill (it needs root): {r.stderr.strip()}")
    yield mnt
    while STARTED:  # nothing may hold a file there any more
        STARTED.pop().close()
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(disk: Path) -> Path:
    """Write a file until the file system has no room left; returns it."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, bytes(65536))
    except OSError:
        pass
    try:
        while True:
            os.write(fd, b"x")
    except OSError:
        pass
    os.close(fd)
    return filler


@pytest.fixture
def full(small_disk) -> tuple[DaemonProcess, list[int], Path]:
    """A daemon restarted on a used store whose disk is now full: (daemon, waiting job ids,
    the filler file)."""
    url = f"sqlite:///{small_disk / 'queue.db'}"
    d = DaemonProcess(url, workers=1).start()
    with d.client() as q:
        ids = [q.enqueue("testjobs:noop", delay=3600) for _ in range(WAITING)]
    assert d.terminate() == 0
    filler = fill(small_disk)
    again = DaemonProcess(url, workers=1).start()
    return again, ids, filler


def test_a_restart_on_a_full_disk_starts_and_says_disk_full(full):
    d, _, _ = full
    line = d.wait_for_line("disk full").string
    assert "serving reads only" in line and d.proc.poll() is None


def test_on_a_full_disk_get_stats_and_jobs_are_served(full):
    d, ids, _ = full
    with d.client() as q:
        assert q.get(ids[0])["state"] == "scheduled"
        assert q.stats()["counts"]["scheduled"] == WAITING
        assert sorted(j["id"] for j in q.jobs()) == ids


def test_on_a_full_disk_an_enqueue_is_refused_naming_the_disk(full):
    d, ids, _ = full
    with d.client() as q:
        with pytest.raises(QueueError) as e:
            q.enqueue("testjobs:noop")
        assert e.value.code == "internal" and "disk full" in e.value.message
        assert q.stats()["counts"]["scheduled"] == WAITING and len(q.jobs()) == WAITING


def test_on_a_full_disk_a_refused_enqueue_says_it_was_not_stored(full):
    # Not "it may have been stored": nothing was written, so a caller may send it again as
    # it is, and the client does not resend it by itself.
    d, _, _ = full
    with d.client() as q:
        with pytest.raises(QueueError) as e:
            q.enqueue("testjobs:noop")
        assert e.value.maybe_committed is False and e.value.message.startswith("disk full:")
        with pytest.raises(QueueError) as e:
            q.enqueue_pipelined([q.job("testjobs:noop"), q.job("testjobs:noop")])
        assert e.value.maybe_committed is False and "disk full" in e.value.message
    d.wait_for_line("its requests were not stored")


def test_writes_are_accepted_again_when_space_returns(full):
    d, _, filler = full
    filler.unlink()
    with d.client() as q:
        job_id = q.enqueue("testjobs:noop")
        assert q.wait(job_id, 20)["state"] == "succeeded"
    d.wait_for_line("disk space is back")


def test_a_job_started_once_space_returns_is_not_recovered_as_an_orphan(small_disk):
    # The previous run was killed with a job running; this one starts on a full disk, so its
    # orphan recovery waits for a sweep after space returns. A job claimed before that
    # sweep runs here: it is not the previous run's, and must not be queued (and run) again.
    url = f"sqlite:///{small_disk / 'queue.db'}"
    gate = Gate()
    try:
        d = DaemonProcess(url, workers=1).start()
        with d.client() as q:
            orphan = q.enqueue("testjobs:gate", args=(gate.port, "orphan"))
            assert gate.arrival() == "orphan"
        d.kill()
        filler = fill(small_disk)
        again = DaemonProcess(url, "--sweep", "5", workers=3).start()
        again.wait_for_line("cannot recover jobs left running")
        time.sleep(0.5)  # past the first sweep: the next one is seconds away
        filler.unlink()
        with again.client() as q:
            mine = q.enqueue("testjobs:gate", args=(gate.port, "mine"))
            arrivals = [gate.arrival()]
            again.wait_for_line(r"recovered jobs left running by a previous run: \d+ re-queued")
            arrivals += [gate.arrival()]  # the orphan, run again
            with pytest.raises(OSError):
                arrivals.append(gate.arrival(2))  # nothing else starts: not `mine` a second time
            assert sorted(arrivals) == ["mine", "orphan"]
            assert q.get(mine)["state"] == "running" and q.get(mine)["orphaned"] == 0
            assert q.get(orphan)["orphaned"] == 1
            gate.release_all()
            assert q.wait(mine, 20)["attempts"] == 1
    finally:
        gate.close()
