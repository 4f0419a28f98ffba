"""Signals that reach a daemon's whole tree: `systemctl stop` without KillMode=mixed sends
SIGTERM to every process of the unit (the daemon, its zygote and each job's process). The
zygote and the jobs let the daemon drive the stop: a running process job finishes (or is
recovered as an orphan by the next start), never ends `crashed`."""

from __future__ import annotations

import os
import signal

import pytest

from queickd.core.job import State


def _tree(pid: int) -> list[int]:
    """`pid` and all its descendants, from /proc (what a unit's cgroup holds)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except FileNotFoundError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except FileNotFoundError:
                pass
    return out


@pytest.mark.parametrize("namespaces", ["auto", "off"])
def test_sigterm_to_every_process_of_the_daemon_lets_a_running_process_job_finish(start_daemon, gate, namespaces):
    # In a session of its own: the signals below reach the daemon's processes, not pytest's.
    d = start_daemon(None, "--job-namespaces", namespaces, prefix=["setsid"])
    with d.client() as q:
        job_id = q.enqueue("testjobs:gate", [gate.port, "held"], isolation="process")
        assert gate.arrival() == "held"
        tree = _tree(d.proc.pid)
        assert len(tree) >= 3, tree  # the daemon, its zygote and the job's process
        os.killpg(d.proc.pid, signal.SIGTERM)  # the daemon's own group, as a terminal would
        for pid in tree:  # and every process of the tree, as systemd's control-group kill does
            os.kill(pid, signal.SIGTERM)
        d.wait_for_line("stopping: no new requests")
    gate.release_all("done")
    assert d.proc.wait(60) == 0  # every running job finished within the stop timeout
    again = start_daemon(d.store_url)
    with again.client() as q:
        job = q.get(job_id)
    assert (job["state"], job["result"]) == (State.SUCCEEDED, "done"), job


def test_a_timeout_still_ends_a_process_job_with_sigterm_at_once(start_daemon):
    d = start_daemon(None, "--stop-timeout", "5")
    with d.client() as q:
        job = q.wait(q.enqueue("sandboxjobs:sleep", [60], timeout=0.5), 20)
    assert (job["state"], job["error"]["type"]) == (State.DEAD, "timeout")
    assert job["error"]["message"].startswith("the job ran past its timeout"), job["error"]
