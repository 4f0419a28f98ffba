"""Resource control against a real daemon (SQLite and PostgreSQL): group limits and cost
budgets measured from the jobs' own start and finish times, patience, refusals at enqueue,
and bad configuration (exit 78 naming the field)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from queickd.core.job import State
from queickd.core.protocol import QueueError


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'queue.db'}"
    return request.getfixturevalue("pg_fresh_database")


def runs(path: Path) -> list[tuple[str, float, float]]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        token, _pid, start, end = line.split()
        out.append((token, float(start), float(end)))
    return out


def peak(spans: list[tuple[float, float, float]]) -> float:
    """The largest sum of weights running at one instant, of (start, end, weight) spans."""
    events = sorted([(s, 1, w) for s, _, w in spans] + [(e, 0, -w) for _, e, w in spans])  # ends first
    now = best = 0.0
    for _, _, w in events:
        now += w
        best = max(best, now)
    return best


def config(tmp_path: Path, text: str) -> str:
    p = tmp_path / "queickd.toml"
    p.write_text(text)
    return str(p)


def test_a_group_of_limit_2_never_has_3_running_and_other_groups_run_meanwhile(start_daemon, store_url, tmp_path):
    d = start_daemon(store_url, workers=6)
    out = tmp_path / "runs.txt"
    with d.client() as q:
        ids = [q.enqueue("testjobs:span", [str(out), f"api{i}", 0.15], concurrency_group="api",
                         concurrency_limit=2) for i in range(10)]
        ids += [q.enqueue("testjobs:span", [str(out), f"db{i}", 0.05], concurrency_group="db",
                          concurrency_limit=3) for i in range(4)]
        for i in ids:
            assert q.wait(i, 30)["state"] == State.SUCCEEDED
    spans = runs(out)
    api = [(s, e, 1) for t, s, e in spans if t.startswith("api")]
    db = [(s, e, 1) for t, s, e in spans if t.startswith("db")]
    assert len(api) == 10 and peak(api) == 2
    assert max(e for _, e, _ in db) < max(e for _, e, _ in api)  # not held behind the api group


def test_budgets_with_mixed_costs_never_exceed_the_budget(start_daemon, store_url, tmp_path):
    cfg = config(tmp_path, '[budgets.pools]\ndefault = 5\n[budgets.groups]\n"tenant:acme" = 3\n')
    d = start_daemon(store_url, "--config", cfg, workers=6)
    out = tmp_path / "runs.txt"
    costs = {}
    with d.client() as q:
        ids = []
        for i in range(18):
            cost = (1, 2, 3)[i % 3]
            group = "tenant:acme" if i % 2 else None
            costs[f"j{i}"] = (cost, group)
            ids.append(q.enqueue("testjobs:span", [str(out), f"j{i}", 0.1], cost_units=cost,
                                 concurrency_group=group, concurrency_limit=10 if group else None))
        for i in ids:
            assert q.wait(i, 30)["state"] == State.SUCCEEDED
    spans = runs(out)
    assert len(spans) == 18
    assert peak([(s, e, costs[t][0]) for t, s, e in spans]) <= 5
    assert peak([(s, e, costs[t][0]) for t, s, e in spans if costs[t][1]]) <= 3


def test_a_cost_10_job_flooded_by_cost_1_jobs_starts_within_the_patience(start_daemon, store_url, tmp_path):
    cfg = config(tmp_path, "budget-patience = 1\n[budgets.pools]\ndefault = 12\n")
    d = start_daemon(store_url, "--config", cfg, workers=8)
    out = tmp_path / "runs.txt"
    with d.client() as q:
        first = [q.enqueue("testjobs:span", [str(out), f"light{i}", 0.4]) for i in range(6)]
        heavy = q.enqueue("testjobs:span", [str(out), "heavy", 0.2], cost_units=10)
        flood = [q.enqueue("testjobs:span", [str(out), f"flood{i}", 0.4]) for i in range(40)]
        for i in [*first, heavy, *flood]:
            assert q.wait(i, 60)["state"] == State.SUCCEEDED
        enqueued_at = q.get(heavy)["created_at"]
    spans = {t: (s, e) for t, s, e in runs(out)}
    assert spans["heavy"][0] - enqueued_at < 1 + 1.5  # the patience, and one cheap run to finish
    assert spans["heavy"][0] < max(s for t, (s, _) in spans.items() if t.startswith("flood"))
    assert peak([(s, e, 10 if t == "heavy" else 1) for t, (s, e) in spans.items()]) <= 12


def test_an_ungrouped_job_behind_a_long_backlog_of_a_used_up_group_budget_runs(start_daemon, store_url, tmp_path,
                                                                               gate):
    from queickd.core.policy.claim import LOOK_AHEAD

    d = start_daemon(store_url, "--config", config(tmp_path, "[budgets.groups]\nopenai = 1\n"), workers=4)
    with d.client() as q:
        q.enqueue("testjobs:gate", [gate.port, "holder"], concurrency_group="openai", concurrency_limit=100)
        assert gate.arrival() == "holder"  # the group's budget is used up while it runs
        q.enqueue_many([q.job("testjobs:noop", [], concurrency_group="openai", concurrency_limit=100)
                        for _ in range(LOOK_AHEAD + 88)])
        free = q.enqueue("testjobs:noop", [])
        assert q.wait(free, 20)["state"] == State.SUCCEEDED
        gate.release_all()


def test_a_budget_lowered_below_a_waiting_jobs_cost_is_logged_and_younger_jobs_still_run(start_daemon, store_url,
                                                                                       tmp_path):
    d = start_daemon(store_url, "--config", config(tmp_path, "[budgets.pools]\ndefault = 4\n"), workers=0)
    with d.client() as q:
        big = q.enqueue("testjobs:noop", [], cost_units=3)
    d.terminate()
    cfg = config(tmp_path, "[budgets.pools]\ndefault = 2\n")  # lowered below it
    d = start_daemon(store_url, "--config", cfg, "--budget-patience", "0", workers=2)
    d.wait_for_line(rf"waiting job\(s\) cost more than the whole budget of pool 'default' \(2\) and can never"
                    rf" start \(ids {big}\): cancel them, or raise the budget")
    with d.client() as q:
        small = [q.enqueue("testjobs:noop", [], cost_units=1) for _ in range(3)]
        for i in small:
            assert q.wait(i, 20)["state"] == State.SUCCEEDED
        assert q.get(big)["state"] == State.QUEUED


def test_a_job_bigger_than_its_budget_is_refused_at_enqueue_naming_the_budget(start_daemon, tmp_path):
    cfg = config(tmp_path, '[budgets.groups]\nopenai = 12\n')
    d = start_daemon(None, "--config", cfg)
    with d.client() as q, pytest.raises(QueueError) as e:
        q.enqueue("testjobs:noop", concurrency_group="openai", concurrency_limit=4, cost_units=13)
    assert e.value.code == "bad_request" and "group 'openai'" in e.value.message


def test_a_function_default_applies_and_a_disagreeing_limit_is_refused(start_daemon, tmp_path):
    cfg = config(tmp_path, '[functions."testjobs:noop"]\nconcurrency_group = "api"\nconcurrency_limit = 2\n'
                 'cost_units = 3\n')
    d = start_daemon(None, "--config", cfg)
    with d.client() as q:
        job = q.get(q.enqueue("testjobs:noop"))
        assert (job["concurrency_group"], job["concurrency_limit"], job["cost_units"]) == ("api", 2, 3)
        own = q.get(q.enqueue("testjobs:noop", cost_units=1))
        assert own["cost_units"] == 1
        with pytest.raises(QueueError) as e:
            q.enqueue("testjobs:noop", concurrency_limit=5)
    assert e.value.code == "bad_request" and "concurrency_limit" in e.value.message


@pytest.mark.parametrize(("fields", "named"), [
    ({"concurrency_limit": 0, "concurrency_group": "g"}, "concurrency_limit"),
    ({"concurrency_limit": -1, "concurrency_group": "g"}, "concurrency_limit"),
    ({"cost_units": 0}, "cost_units"),
    ({"cost_units": -2.5}, "cost_units"),
    ({"cost_units": "three"}, "cost_units"),
    ({"concurrency_group": "g" * 201}, "concurrency_group"),
])
def test_bad_resource_fields_are_refused_at_enqueue_naming_the_field(client, fields, named):
    with pytest.raises(QueueError) as e:
        client.enqueue("testjobs:noop", **fields)
    assert e.value.code == "bad_request" and named in e.value.message


@pytest.mark.parametrize(("text", "named"), [
    ("[budgets.pools]\ndefault = 0\n", "budgets.pools.default"),
    ("[budgets.groups]\napi = -3\n", "budgets.groups.api"),
    ("[budgets.groups]\napi = \"many\"\n", "budgets.groups.api"),
    ("[budgets.queues]\ndefault = 3\n", "queues"),
    ('[functions."testjobs:noop"]\ncost_units = "abc"\n', "cost_units"),
    ('[functions."testjobs:noop"]\nconcurrency_limit = 0\n', "concurrency_limit"),
])
def test_a_bad_budget_or_function_default_in_the_config_file_exits_78_naming_it(tmp_path, text, named):
    cfg = config(tmp_path, text)
    r = subprocess.run([sys.executable, "-m", "queickd", "run", "--config", cfg, "--port", "0",
                        "--store", f"sqlite:///{tmp_path / 'q.db'}"], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ), stdin=subprocess.DEVNULL)
    assert r.returncode == 78 and named in r.stderr, r.stderr


def test_queick_enqueue_takes_the_resource_flags(daemon):
    r = subprocess.run([sys.executable, "-m", "queickd", "enqueue", "testjobs:noop", "--port", str(daemon.port),
                        "--concurrency-group", "api", "--concurrency-limit", "2", "--cost-units", "1.5",
                        "--json"], capture_output=True, text=True, timeout=60, env=dict(os.environ),
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    import json

    with daemon.client() as q:
        job = q.get(json.loads(r.stdout)["job_id"])
    assert (job["concurrency_group"], job["concurrency_limit"], job["cost_units"]) == ("api", 2, 1.5)


def test_a_hook_gives_its_deliveries_jobs_its_group_and_cost():
    from queickd.api.hooks import parse_hooks

    (hook,) = parse_hooks({"gh": {"func": "testjobs:noop", "concurrency_group": "gh", "concurrency_limit": 1,
                                  "cost_units": 2}}).values()
    assert dict(hook.job) == {"concurrency_group": "gh", "concurrency_limit": 1, "cost_units": 2.0}
    with pytest.raises(ValueError, match="hooks.gh: cost_units"):
        parse_hooks({"gh": {"func": "testjobs:noop", "cost_units": 0}})


def test_budgets_show_in_stats_metrics_the_status_page_and_queick_budgets(start_daemon, tmp_path, gate):
    import urllib.request

    cfg = config(tmp_path, '[budgets.pools]\ndefault = 4\n[budgets.groups]\nopenai = 3\n')
    d = start_daemon(None, "--config", cfg, "--http", "127.0.0.1:0")
    port = int(d.wait_for_line(r"HTTP endpoint http://\S+:(\d+)/").group(1))
    with d.client() as q:
        q.enqueue("testjobs:gate", [gate.port, "a"], cost_units=3, concurrency_group="openai", concurrency_limit=9)
        assert gate.arrival() == "a"
        q.enqueue("testjobs:noop", cost_units=2)  # 3 + 2 > 4: it waits
        (pool, group) = q.stats()["budgets"]
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read().decode()
        shown = subprocess.run([sys.executable, "-m", "queickd", "budgets", "--port", str(d.port)],
                               capture_output=True, text=True, timeout=60, env=dict(os.environ)).stdout
        gate.release_all()
    assert pool == {"kind": "pool", "name": "default", "limit": 4, "running": 3, "running_jobs": 1,
                    "waiting": 2, "waiting_jobs": 1}
    assert (group["name"], group["running"], group["waiting"]) == ("openai", 3, 0)
    assert 'queickd_budget_running_units{kind="pool",name="default"} 3' in metrics
    assert "<h2>Budgets</h2>" in page and "group openai" in page
    assert "budget pool default: 3/4 units running (1 jobs), 2 waiting (1 jobs)" in shown


def test_an_events_job_carries_the_resource_fields(client):
    fields = {"concurrency_group": "api", "concurrency_limit": 2, "cost_units": 1.5}
    reply = client.emit_event("e-1", "testjobs:noop", **fields)
    job = client.get(reply["job_id"])
    assert {k: job[k] for k in fields} == fields


def test_a_crons_runs_carry_the_resource_fields(client, gate):
    import time as _time

    from queickd import SchedulingTime

    fields = {"concurrency_group": "api", "concurrency_limit": 2, "cost_units": 1.5}
    client.cron(SchedulingTime().every(hours=1).starting_from(_time.time()), "testjobs:gate", [gate.port, "c"],
                name="hourly", **fields)
    assert gate.arrival() == "c"  # the cron's first run has started
    (job,) = [j for j in client.jobs(State.RUNNING) if j["cron"] == "hourly"]
    gate.release_all()
    assert {k: job[k] for k in fields} == fields
