"""GET /: the self-contained status page, holding the numbers the daemon holds."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from httphelpers import start_web

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def busy_web(start_daemon, tmp_path, gate):
    """A daemon with one job held running, two waiting on key 'door', a dead letter and a
    paused key."""
    web = start_web(start_daemon, tmp_path, "pause-after = 1\n", workers=2)
    with web.daemon.client() as q:
        q.wait(q.enqueue("testjobs:fail", ["card reader unplugged"]), 20)  # dead, no retry
        # pause-after 1: each failure pauses its function, and this one its key too
        q.wait(q.enqueue("testjobs:append_time_and_fail", [str(tmp_path / "t")], key="slack"), 20)
        q.enqueue("testjobs:gate", [gate.port, "held"])
        assert gate.arrival() == "held"
        q.enqueue("testjobs:gate", [gate.port, "a"], key="door")
        q.enqueue("testjobs:noop", key="door")  # waits behind the first of its key
    return web


def cell(page: str, metric: str) -> str:
    m = re.search(rf'data-metric="{metric}">([^<]*)<', page)
    assert m, f"no {metric} on the page"
    return m.group(1)


def test_status_page_is_one_self_contained_html_page(busy_web):
    r = busy_web.get("/")
    assert r.status == 200
    assert r.headers["content-type"].startswith("text/html")
    page = r.body.decode()
    assert page.startswith("<!doctype html>")
    assert "<svg" in page and "</svg>" in page  # the chart, inline
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing loaded from elsewhere
    assert '<meta http-equiv="refresh"' in page


def test_status_page_flags_a_pool_with_waiting_jobs_and_no_live_worker(start_daemon, tmp_path):
    web = start_web(start_daemon, tmp_path, workers=2)
    with web.daemon.client() as q:
        q.enqueue("testjobs:noop", pool="gpu")
    page = web.get("/").body.decode()
    assert cell(page, "unserved-pools") == "1"
    rows = re.findall(r"<tr>((?:<td>[^<]*</td>)+)</tr>", page)
    assert "<td>gpu</td><td>1</td><td>0</td><td>NO LIVE WORKER: its jobs wait</td>" in rows
    assert "<td>default</td><td>0</td><td>2</td><td></td>" in rows


def test_status_page_holds_the_daemons_numbers(busy_web, gate):
    page = busy_web.get("/").body.decode()
    # One job held by the gate, the first 'door' job also started (two workers).
    gate.arrival()
    page = busy_web.get("/").body.decode()
    assert cell(page, "workers-busy") == "2 / 2"
    assert cell(page, "workers-idle") == "0"
    assert cell(page, "waiting") == "1"
    assert cell(page, "dead") == "2"
    assert cell(page, "scheduler") == "alive"
    assert cell(page, "network") == "no checker"
    assert "<td>door</td><td>1</td>" in page
    assert "card reader unplugged" in page  # a dead letter's error
    assert "<td>key</td><td>slack</td>" in page  # paused
    assert "testjobs:gate" in page  # running


def test_status_page_shows_a_running_jobs_progress(start_daemon, tmp_path, gate):
    web = start_web(start_daemon, tmp_path)
    with web.daemon.client() as q:
        job = q.enqueue("progressjobs:report_then_gate", [gate.port, 42, 100, "<b>copying</b>"])
        assert gate.arrival() == "reported"
        end = time.monotonic() + 20
        while q.get(job)["progress"] is None:  # written within a fraction of a second
            assert time.monotonic() < end
    page = web.get("/").body.decode()
    assert f"<td>{job}</td><td>progressjobs:report_then_gate</td>" in page
    assert "42/100 (42%) &lt;b&gt;copying&lt;/b&gt;</td>" in page


def test_status_page_escapes_what_jobs_put_in_it(start_daemon, tmp_path):
    web = start_web(start_daemon, tmp_path)
    with web.daemon.client() as q:
        q.wait(q.enqueue("testjobs:fail", ["<script>alert(1)</script>"]), 20)
    page = web.get("/").body.decode()
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


@pytest.mark.skipif(not Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is None,
                    reason=f"{CHROMIUM} is not installed (Debian: apt-get install chromium)")
def test_status_page_renders_in_headless_chromium(busy_web, tmp_path):
    shot = tmp_path / "status.png"
    url = f"http://{busy_web.host}:{busy_web.port}/"
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1000,1100",
                        f"--screenshot={shot}", url], capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000  # a drawn page, not a blank one
    keep = os.environ.get("QUEICKD_SCREENSHOT")
    if keep:  # for a person to look at: QUEICKD_SCREENSHOT=/tmp/status.png pytest -k chromium
        shutil.copy(shot, keep)


@pytest.fixture
def held_web(start_daemon, tmp_path):
    """A job waiting out a retry, one scheduled for later, a function paused by hand and a
    key whose next job is of that function."""
    web = start_web(start_daemon, tmp_path, "", workers=2)
    with web.daemon.client() as q:
        retry = q.enqueue("testjobs:fail", ["flaky upstream"], retry=True, retry_type="constant",
                          retry_interval=3600, max_attempts=3)
        q.wait(retry, 20, states=["scheduled"])
        q.enqueue("testjobs:noop", delay=3600)
        q.pause(func="testjobs:add")
        q.enqueue("testjobs:add", [1, 2], key="ledger")
        q.enqueue("testjobs:noop", key="ledger")  # behind the paused function's job
    return web


def test_status_page_shows_retries_apart_from_later_jobs(held_web):
    page = held_web.get("/").body.decode()
    assert cell(page, "retrying") == "1" and cell(page, "scheduled-later") == "1"


def test_status_page_shows_pauses_among_the_top_cards(held_web):
    page = held_web.get("/").body.decode()
    assert cell(page, "paused") == "func testjobs:add"
    assert page.index('data-metric="paused"') < page.index("<h2>")


def test_status_page_says_a_key_is_blocked_by_a_paused_function(held_web):
    page = held_web.get("/").body.decode()
    assert ("<td>ledger</td><td>2</td>" in page
            and "blocked: its next job&#x27;s function testjobs:add is paused" in page)


@pytest.mark.parametrize("fixture", ["busy_web", "held_web"])
def test_status_page_has_no_empty_table_header(fixture, request):
    assert "<th></th>" not in request.getfixturevalue(fixture).get("/").body.decode()


def test_the_chart_survives_a_restart(start_daemon, tmp_path):
    web = start_web(start_daemon, tmp_path, "", workers=2)
    with web.daemon.client() as q:
        for i in range(3):
            q.wait(q.enqueue("testjobs:add", [i, i]), 20)
        q.wait(q.enqueue("testjobs:fail"), 20)
    assert web.daemon.terminate() == 0
    again = start_web(start_daemon, tmp_path, "", workers=2)
    with again.daemon.client() as q:
        history = q.stats(detail=True)["history"]
    assert (sum(h["completed"] for h in history), sum(h["failed"] for h in history)) == (3, 1)
    assert " done</title>" in again.get("/").body.decode()  # the chart draws them


@pytest.mark.skipif(not Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is None,
                    reason=f"{CHROMIUM} is not installed (Debian: apt-get install chromium)")
def test_status_page_with_retries_pauses_and_a_blocked_key_renders_in_headless_chromium(held_web, tmp_path):
    shot = tmp_path / "held.png"
    url = f"http://{held_web.host}:{held_web.port}/"
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1000,1200",
                        f"--screenshot={shot}", url], capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    keep = os.environ.get("QUEICKD_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)
