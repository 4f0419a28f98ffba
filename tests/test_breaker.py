"""The auto-pause as a circuit breaker, against a real daemon: a pause lets one probe job
through after its cooldown; the probe's success resumes, its failure pauses again for longer;
--pause-after 0 turns it off; stats, /metrics and the status page show the next probe."""

from __future__ import annotations

from queickd.core.job import State

FUNC = "testjobs:fail_while"


def _trip(q, d, flag):
    for _ in range(2):
        assert q.wait(q.enqueue(FUNC, args=(str(flag),)), 20)["state"] == State.DEAD
    d.wait_for_line(f"func {FUNC} paused after 2 failed runs")


def test_a_pause_probes_after_its_cooldown_pauses_again_on_failure_and_resumes_on_success(start_daemon, tmp_path):
    flag = tmp_path / "down"
    flag.write_text("")
    d = start_daemon(None, "--pause-after", "2", "--pause-cooldown", "1", workers=2)
    with d.client() as q:
        _trip(q, d, flag)
        (p,) = q.stats()["paused"]
        assert (p["kind"], p["name"], p["trips"]) == ("func", FUNC, 1) and p["probe_at"] > p["paused_at"]
        first, second = (q.enqueue(FUNC, args=(str(flag),)) for _ in range(2))
        # The first is the probe, a second later; it fails: paused again, for 2 s this time.
        assert q.wait(first, 20)["state"] == State.DEAD
        assert q.get(second)["state"] == State.QUEUED
        (p,) = q.stats()["paused"]
        assert p["trips"] == 2 and p["probe_at"] - q.get(first)["finished_at"] >= 1.9
        flag.unlink()  # the outage ends: the next probe succeeds and the function resumes
        assert q.wait(second, 20)["result"] == "up"
        assert q.stats()["paused"] == []
        assert q.wait(q.enqueue(FUNC, args=(str(flag),)), 20)["result"] == "up"


def test_a_job_with_retries_left_does_not_count_toward_a_pause(start_daemon, tmp_path):
    flag = tmp_path / "down"
    flag.write_text("")
    d = start_daemon(None, "--pause-after", "2", workers=1)
    with d.client() as q:
        job = q.wait(q.enqueue(FUNC, args=(str(flag),), retry=True, retry_type="constant", retry_interval=0.1,
                               max_attempts=3), 30)
        assert job["state"] == State.DEAD and job["attempts"] == 3
        assert q.stats()["paused"] == []  # three failed runs, one dead job


def test_pause_after_zero_never_pauses(start_daemon, tmp_path):
    flag = tmp_path / "down"
    flag.write_text("")
    d = start_daemon(None, "--pause-after", "0", workers=1)
    with d.client() as q:
        for _ in range(4):
            q.wait(q.enqueue(FUNC, args=(str(flag),)), 20)
        assert q.stats()["paused"] == []
        flag.unlink()
        assert q.wait(q.enqueue(FUNC, args=(str(flag),)), 20)["result"] == "up"


def test_stats_metrics_and_the_status_page_show_the_next_probe(start_daemon, tmp_path):
    from httphelpers import scrape, start_web

    flag = tmp_path / "down"
    flag.write_text("")
    web = start_web(start_daemon, tmp_path, "pause-after = 2\npause-cooldown = \"1h\"\n", workers=1)
    with web.daemon.client() as q:
        _trip(q, web.daemon, flag)
        (p,) = q.stats()["paused"]
        assert p["probe_at"] - p["paused_at"] == 3600
        metrics = scrape(web)
        assert metrics[("queickd_pause_next_probe_timestamp_seconds", (("kind", "func"), ("name", FUNC)))] == (
            p["probe_at"])
        assert "next probe in 60m" in web.get("/").body.decode()
