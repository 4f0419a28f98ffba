"""Rate limits against a real daemon (SQLite and PostgreSQL): starts measured from the jobs'
own start times, a run refused for its rate (queickd.RateLimited) waiting without burning
an attempt, function defaults, what operators see, and bad input refused naming the field."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from test_resources_daemon import config

from queickd.core.job import State
from queickd.core.protocol import QueueError


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'queue.db'}"
    return request.getfixturevalue("pg_fresh_database")


def most_in_a_window(starts: list[float], per: float) -> int:
    starts = sorted(starts)
    return max(sum(1 for t in starts[i:] if t < s + per) for i, s in enumerate(starts))


def test_a_rate_key_starts_no_more_than_its_limit_per_window_and_others_pass_it(start_daemon, store_url, tmp_path):
    d = start_daemon(store_url, workers=4)
    with d.client() as q:
        limited = [q.enqueue("testjobs:noop", rate_limit=("slack", 2, 0.5)) for _ in range(8)]
        free = [q.enqueue("testjobs:noop") for _ in range(4)]
        for i in [*limited, *free]:
            assert q.wait(i, 30)["state"] == State.SUCCEEDED
        slack = [q.get(i)["started_at"] for i in limited]  # as the claims stamped them
        others = [q.get(i)["started_at"] for i in free]
    assert most_in_a_window(slack, 0.5) <= 2
    assert slack == sorted(slack)  # in enqueue order
    assert max(others) < max(slack)  # not held behind them
    assert max(slack) - min(slack) < 1.5 + 2.0  # 3 windows to wait; woken by timers, not a sweep


def test_a_job_refused_for_its_rate_waits_its_retry_after_and_burns_no_attempt(start_daemon, store_url, tmp_path):
    d = start_daemon(store_url, workers=2)
    with d.client() as q:
        # One attempt in all (no retry policy): a counted refusal would make it dead.
        told = q.enqueue("testjobs:refused_once", [str(tmp_path / "told"), 0.6], rate_limit=("api", 100, 1.0))
        done = q.wait(told, 30)
        assert (done["state"], done["attempts"], done["result"]) == (State.SUCCEEDED, 1, "posted")
    refused_at = os.path.getmtime(tmp_path / "told")
    assert done["started_at"] >= refused_at + 0.6 - 0.01  # its key started nothing before the Retry-After


def test_a_functions_configured_rate_limit_applies_to_its_jobs(start_daemon, tmp_path):
    cfg = config(tmp_path, '[functions."testjobs:noop"]\nrate_limit = { key = "api", limit = 5, per = 1.5 }\n')
    d = start_daemon(None, "--config", cfg)
    with d.client() as q:
        assert q.get(q.enqueue("testjobs:noop"))["rate_limit"] == {"key": "api", "limit": 5, "per": 1.5}


@pytest.mark.parametrize(("rate_limit", "named"), [
    (("k", 0, 1.0), "rate_limit.limit"),
    (("k", -1, 1.0), "rate_limit.limit"),
    (("k", 10**9, 1.0), "rate_limit.limit"),
    (("k", 1.5, 1.0), "rate_limit.limit"),
    (("k", 1, 0), "rate_limit.per"),
    (("k", 1, -2.0), "rate_limit.per"),
    (("k", 1, float("nan")), "rate_limit.per"),
    (("k", 1, 1e12), "rate_limit.per"),
    (("", 1, 1.0), "rate_limit.key"),
    ({"key": "k", "limit": 1}, "rate_limit"),
    ("k", "rate_limit"),
])
def test_bad_rate_limits_are_refused_at_enqueue_naming_the_field(client, rate_limit, named):
    with pytest.raises(QueueError) as e:
        client.enqueue("testjobs:noop", rate_limit=rate_limit)
    assert e.value.code == "bad_request" and named in e.value.message


def test_a_bad_rate_limit_in_the_config_file_exits_78_naming_it(tmp_path):
    cfg = config(tmp_path, '[functions."testjobs:noop"]\nrate_limit = { key = "api", limit = 0, per = 1 }\n')
    r = subprocess.run([sys.executable, "-m", "queickd", "run", "--config", cfg, "--port", "0",
                        "--store", f"sqlite:///{tmp_path / 'q.db'}"], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ), stdin=subprocess.DEVNULL)
    assert r.returncode == 78 and "rate_limit.limit" in r.stderr, r.stderr


def test_the_sql_enqueue_refuses_a_bad_rate_limit_naming_it(pg_store):
    import psycopg

    c = psycopg.connect(pg_store._dsn)
    for bad, named in (({"key": "k", "limit": 0, "per": 1}, "rate_limit.limit"),
                       ({"key": "k", "limit": 1, "per": "NaN"}, "rate_limit"),
                       ({"key": "k", "limit": 1}, "rate_limit")):
        with pytest.raises(psycopg.Error) as e:
            c.execute("SELECT enqueue('m:f', '[]', %s)", (psycopg.types.json.Jsonb({"rate_limit": bad}),))
        assert e.value.sqlstate == "QD400" and named in str(e.value)
        c.rollback()
    (job_id,) = c.execute("SELECT enqueue('m:f', '[]', %s)", (psycopg.types.json.Jsonb(
        {"rate_limit": {"key": "k", "limit": 2, "per": 1.5}}),)).fetchone()
    c.commit()
    c.close()
    assert pg_store.get(job_id).rate_limit == {"key": "k", "limit": 2, "per": 1.5}




def test_operators_see_each_rate_keys_limit_window_use_and_next_start(start_daemon, tmp_path):
    from httphelpers import scrape, start_web
    from test_operator_cli import queick

    web = start_web(start_daemon, tmp_path, workers=2)
    with web.daemon.client() as q:
        ids = [q.enqueue("testjobs:noop", rate_limit=("slack:#general", 1, 3600.0)) for _ in range(2)]
        assert q.wait(ids[0], 20)["state"] == State.SUCCEEDED
        (key,) = q.stats()["rate_keys"]
    assert (key["key"], key["limit"], key["per"], key["used"]) == ("slack:#general", 1, 3600.0, 1)
    assert key["next_start"] > time.time() + 3000
    m = scrape(web)
    label = (("key", "slack:#general"),)
    assert m[("queickd_rate_limit_starts", label)] == 1 and m[("queickd_rate_window_used_starts", label)] == 1
    assert m[("queickd_rate_next_start_timestamp_seconds", label)] == key["next_start"]
    line = next(x for x in queick(web.daemon.port, "status").stdout.splitlines() if x.startswith("slack:#general"))
    assert line.split()[1:4] == ["1/1", "3600s", "in"]
    page = web.get("/").body.decode()
    assert "Rate limits" in page and "slack:#general" in page and "1 per 3600 s" in page


def test_the_clients_take_a_rate_limit_as_a_tuple_or_the_wire_dict(daemon):
    from queickd import JobQueue

    wire = {"key": "api", "limit": 3, "per": 2.0}
    assert JobQueue.job("testjobs:noop", rate_limit=("api", 3, 2.0))["rate_limit"] == wire
    assert JobQueue.job("testjobs:noop", rate_limit=wire)["rate_limit"] == wire
    with daemon.client() as q:
        task = q.task(rate_limit=("api", 3, 2.0))(__import__("testjobs").noop)
        assert q.get(task.enqueue().id)["rate_limit"] == wire


def test_the_async_client_takes_a_rate_limit(daemon):
    import asyncio

    from queickd import AsyncJobQueue

    async def go() -> dict:
        async with AsyncJobQueue(port=daemon.port) as q:
            return await q.get(await q.enqueue("testjobs:noop", rate_limit=("api", 3, 2.0)))

    assert asyncio.run(go())["rate_limit"] == {"key": "api", "limit": 3, "per": 2.0}


def test_a_webhooks_deliveries_carry_its_rate_limit(start_daemon, tmp_path):
    from httphelpers import start_web

    web = start_web(start_daemon, tmp_path, '[hooks.gh]\nfunc = "webjobs:echo"\n'
                    'rate_limit = { key = "github", limit = 5, per = 1.0 }\n')
    reply = web.post_json("/hooks/gh", {"n": 1})
    assert reply.status == 202
    import json

    with web.daemon.client() as q:
        job = q.get(json.loads(reply.body)["job_id"])
    assert job["rate_limit"] == {"key": "github", "limit": 5, "per": 1.0}


def test_queick_enqueue_sends_its_rate_limit_and_the_daemon_checks_it(start_daemon):
    d = start_daemon()

    def enqueue(*flags):
        return subprocess.run([sys.executable, "-m", "queickd", "enqueue", "testjobs:noop", "--port", str(d.port),
                               *flags], capture_output=True, text=True, timeout=60)

    ok = enqueue("--rate-limit", "slack:#general", "2", "1.5")
    assert ok.returncode == 0, ok.stderr
    with d.client() as q:
        job = q.get(int(ok.stdout))
    assert job["rate_limit"] == {"key": "slack:#general", "limit": 2, "per": 1.5}
    bad = enqueue("--rate-limit", "slack:#general", "0", "1")
    assert bad.returncode != 0 and "rate_limit.limit" in bad.stderr


def test_a_window_opening_on_a_busy_daemon_wakes_an_idle_one_of_the_fleet(start_daemon, pg_fresh_database, gate):
    # The daemon whose claim filled the key holds its timer; busy when the window opens, it
    # wakes the fleet: the other daemon, which met the full key and holds no timer, claims.
    daemons = [start_daemon(pg_fresh_database, workers=1) for _ in range(2)]
    with daemons[0].client() as q:
        q.enqueue("testjobs:gate", [gate.port, "first"], rate_limit=("k", 1, 1.0))
        assert gate.arrival() == "first"  # one daemon's only worker is held: it is busy
        second = q.enqueue("testjobs:noop", rate_limit=("k", 1, 1.0))
        done = q.wait(second, 15)  # not the next safety sweep's minute
        assert done["state"] == State.SUCCEEDED, done
        gate.release_all()
