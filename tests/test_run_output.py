"""A process run's captured output through a real daemon: the job's own `output`, whatever
its fate, in `get` and `queick show`; cut at the stored maximum with a marker; none for a
thread run."""

from __future__ import annotations

import subprocess
import sys

from queickd.core.job import State
from queickd.run.watch import MAX_STORED_OUTPUT

INDENT = " " * 18  # where `queick show` starts each line of a block


def _show(daemon, job_id: int) -> str:
    out = subprocess.run([sys.executable, "-m", "queickd", "show", str(job_id), "--port", str(daemon.port)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_process_job_that_prints_and_succeeds_has_its_output_in_get(client):
    job = client.wait(client.enqueue("sandboxjobs:talk", isolation="process"), 20)
    assert (job["state"], job["result"], job["output"]) == (State.SUCCEEDED, "talked", "to stdout\nto stderr\n")
    assert job["error"] is None


def test_queick_show_prints_a_succeeded_process_jobs_output(client, daemon):
    job_id = client.wait(client.enqueue("sandboxjobs:talk", isolation="process"), 20)["id"]
    assert f"output:\n{INDENT}to stdout\n{INDENT}to stderr\n" in _show(daemon, job_id)


def test_output_over_the_stored_maximum_is_cut_with_a_marker(client):
    job = client.wait(client.enqueue("sandboxjobs:talk", [200], isolation="process"), 20)
    assert job["state"] == State.SUCCEEDED  # under its output limit (1024 KB): only the stored copy is cut
    kept, marker = job["output"].rsplit("\n", 1)
    assert kept.startswith("to stdout\nto stderr\nzzz") and len(kept) == MAX_STORED_OUTPUT
    assert marker == f"[… {200 * 1024 + 20} bytes in all; the first {MAX_STORED_OUTPUT} kept]"


def test_a_thread_job_that_prints_has_no_output(client):
    job = client.wait(client.enqueue("sandboxjobs:talk", isolation="thread"), 20)
    assert (job["state"], job["output"]) == (State.SUCCEEDED, None)


def test_a_process_job_that_prints_nothing_has_no_output(client):
    job = client.wait(client.enqueue("sandboxjobs:noop", isolation="process"), 20)
    assert (job["state"], job["output"]) == (State.SUCCEEDED, None)


def test_a_failed_process_job_keeps_its_output_in_the_job(client):
    job = client.wait(client.enqueue("sandboxjobs:chatty", isolation="process"), 20)
    assert (job["state"], job["error"]["type"]) == (State.DEAD, "ValueError")
    assert job["output"] == "to stdout\nto stderr\n" and "output" not in job["error"]


def test_a_retried_job_shows_the_output_of_its_last_run(start_daemon, tmp_path):
    # The daemon's TMPDIR (private to each job where it gets namespaces) is not where the
    # marker goes: the two runs share it.
    (tmp_path / "tmp").mkdir()
    client = start_daemon(None, env={"TMPDIR": str(tmp_path / "tmp")}).client()
    job = client.wait(client.enqueue("sandboxjobs:fail_once", [str(tmp_path / "ran")], isolation="process",
                                     retry=True, retry_type="constant", retry_interval=0.1, max_attempts=2), 20)
    assert (job["state"], job["attempts"], job["output"]) == (State.SUCCEEDED, 2, "second run\n")


def test_a_process_job_on_postgresql_keeps_its_output(pg_fresh_database, start_daemon):
    d = start_daemon(pg_fresh_database)
    with d.client() as q:
        job = q.wait(q.enqueue("sandboxjobs:talk", isolation="process"), 30)
    assert (job["state"], job["output"]) == (State.SUCCEEDED, "to stdout\nto stderr\n")


def test_a_listing_carries_the_end_of_each_jobs_output_and_get_all_of_it(client):
    from queickd.core.job import OUTPUT_PREVIEW

    job_id = client.wait(client.enqueue("sandboxjobs:talk", [40], isolation="process"), 20)["id"]
    whole = client.get(job_id)["output"]
    (listed,) = [j for j in client.jobs(state=State.SUCCEEDED) if j["id"] == job_id]
    assert len(whole) == 40 * 1024 + 20
    assert listed["output"] == whole[-OUTPUT_PREVIEW:] and listed["output_chars"] == len(whole)


def test_a_listing_of_many_jobs_with_the_most_output_stays_readable(client):
    ids = client.enqueue_many([client.job("sandboxjobs:talk", [200], isolation="process") for _ in range(70)])
    for i in ids:
        client.wait(i, 60)
    listed = client.jobs(state=State.SUCCEEDED, limit=100)  # 70 x 64 KiB whole would pass a reply's 4 MiB
    assert len([j for j in listed if j["id"] in set(ids)]) == 70
