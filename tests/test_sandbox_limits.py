"""Limits that hold without cgroups (the RSS watch): a job's whole process tree counts, its
/dev/shm is its own and bounded, and RLIMIT_NPROC bounds its processes. Real zygotes and
children, cgroups off; each case with and without the job's own namespaces."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_fate import make_job
from test_sandbox_isolation import nobody  # noqa: F401 - the fixture

from queickd.core.job import State
from queickd.core.sandbox import Limits
from queickd.run import cgroup
from queickd.run.process import ProcessRunner
from queickd.run.supervisor import ZygoteSupervisor

JOBS = str(Path(__file__).parent / "jobs")


@pytest.fixture(scope="module", params=["namespaces", "no namespaces"])
def rss_runner(request):
    sup = ZygoteSupervisor(JOBS, namespaces=request.param == "namespaces")
    r = ProcessRunner(sup, use_cgroup=False)
    sup.start()
    if request.param == "namespaces" and sup.namespaces is not None:
        sup.stop()
        pytest.skip(f"no namespaces for jobs here: {sup.namespaces}")
    yield r
    sup.stop()


def test_four_forked_children_over_the_limit_together_are_killed_by_the_rss_watch(rss_runner):
    r = rss_runner.run(make_job(func="sandboxjobs:fork_hogs", args=[4, 100]), Limits(timeout=60, memory_mb=64))
    assert (r.ok, r.error_type) == (False, "memory_limit"), r
    assert r.peak_memory >= 64 << 20


def test_a_jobs_dev_shm_is_its_own_bounded_by_its_limit_and_gone_after_it(rss_runner):
    if rss_runner.supervisor.namespaces is not None:
        pytest.skip("without a mount namespace /dev/shm is the host's: see docs/security.md")
    name = f"queickd-shm-{os.getpid()}"
    r = rss_runner.run(make_job(func="sandboxjobs:fill_shm", args=[200, name]), Limits(timeout=60, memory_mb=64))
    assert (not r.ok and r.error_type == "memory_limit") or (r.ok and r.result <= 64), r
    assert not os.path.exists(f"/dev/shm/{name}")


def test_a_job_of_a_plain_user_without_cgroups_is_held_by_rlimit_nproc(start_daemon, nobody):  # noqa: F811
    d = start_daemon(nobody[0], prefix=nobody[1])
    with d.client() as q:
        assert q.stats()["sandbox"]["limits"]["memory"] == "RSS watch"  # nobody may make no cgroup here
        job = q.wait(q.enqueue("sandboxjobs:spawn_until_refused", [2 * cgroup.PIDS_MAX], timeout=60), 60)
    assert job["state"] == State.SUCCEEDED, job
    # PIDS_MAX above what the user ran as the job started: the count is the user's, so tasks
    # of nobody that end meanwhile (other tests' daemons) give some room back.
    assert cgroup.PIDS_MAX // 2 < job["result"] < cgroup.PIDS_MAX + 128, job["result"]
