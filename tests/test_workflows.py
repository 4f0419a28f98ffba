"""Workflows through the front door: the wire ops, the Python client's builder, the config
file's [workflows.NAME], a webhook starting a run, the CLI and the status outputs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import wfsteps

from queickd import QueueError


def test_a_run_built_with_the_client_reaches_its_final_state(client):
    run_id = (client.workflow("research").then(wfsteps.plan).for_each("tasks", wfsteps.square, "results")
              .then("wfsteps:total").budget(max_transitions=20, max_for_each_items=12).start(state={"n": 10}))
    run = client.workflow_wait(run_id, 30)
    assert run["state"] == "succeeded" and run["data"]["total"] == 285
    assert run["budget"]["transitions"] == {"limit": 20, "used": 3}
    assert run["state_bytes"] == len(json.dumps(run["data"], separators=(",", ":")))
    fan = next(s for s in run["steps"] if s["name"] == "square")
    assert sorted(j["item"] for j in fan["jobs"]) == list(range(10))


def test_workflow_wait_returns_a_budget_stop_naming_the_budget(client):
    run_id = client.workflow("loop").then(wfsteps.count_up, name="count").budget(max_transitions=4).start()
    run = client.workflow_wait(run_id, 30)
    assert run["state"] == "budget_exceeded"
    assert (run["reason"]["budget"], run["reason"]["limit"], run["reason"]["usage"]) == ("max_transitions", 4, 5)


@pytest.mark.parametrize("definition, state, message", [
    ({"name": "w", "steps": [{"name": "a", "kind": "nope", "func": "wfsteps:noop"}]}, {}, "unknown kind"),
    ({"name": "w", "steps": [{"name": "a", "func": "wfsteps:noop"}, {"name": "a", "func": "wfsteps:noop"}]},
     {}, "duplicate step"),
    ({"name": "w", "steps": [{"name": "a", "func": "wfsteps:noop", "next": "b"}]}, {}, "names no step"),
    ({"name": "w", "steps": [{"name": "a", "func": "wfsteps:noop"}], "budget": {"max_cost_units": -1}}, {},
     "positive integer"),
    ({"name": "w", "steps": [{"name": "a", "func": "wfsteps:noop"}]}, [1], "state must be a JSON object"),
    ({"name": "w", "steps": [{"name": "a", "func": "wfsteps:noop", "pad": "x" * 70_000}]}, {}, "65536"),
])
def test_a_bad_start_is_a_bad_request_and_starts_nothing(client, definition, state, message):
    with pytest.raises(QueueError, match=message) as e:
        client._call({"op": "workflow_start", "definition": definition, "state": state})
    assert e.value.code == "bad_request"
    assert client.workflows() == []


def test_a_step_function_outside_the_allowlist_is_refused_at_start(client):
    with pytest.raises(QueueError) as e:
        client.workflow("w").then(wfsteps.noop).for_each("xs", "json:dumps").start()
    assert e.value.code == "not_allowed" and client.workflows() == []


def test_cancel_ends_a_running_run_and_its_waiting_jobs_and_discards_what_still_runs(client, gate):
    run_id = client.workflow("w").for_each("xs", wfsteps.gated).start(state={"xs": list(range(8)),
                                                                             "port": gate.port})
    gate.arrival()
    cancelled = client.workflow_cancel(run_id)
    assert cancelled["state"] == "cancelled"
    jobs = [j for s in cancelled["steps"] for j in s["jobs"]]
    assert {j["state"] for j in jobs} <= {"cancelled", "running"} and any(j["state"] == "cancelled" for j in jobs)
    running = [j["job_id"] for j in jobs if j["state"] == "running"]
    for _ in running[1:]:
        gate.arrival()
    gate.release_all()
    for job_id in running:
        client.wait(job_id, 30)
    after = client.workflow_get(run_id)
    assert (after["state"], after["progress"]) == ("cancelled", {})
    assert [r["run_id"] for r in client.workflows(state="cancelled")] == [run_id]


@pytest.mark.parametrize("store", ["sqlite", "memory", "postgres"])
def test_a_run_whose_transition_raises_ends_failed_naming_the_step_and_runs_finished_with_it_succeed(
        start_daemon, gate, request, store):
    url = {"sqlite": None, "memory": "memory://"}.get(store) or request.getfixturevalue("pg_fresh_database")
    daemon = start_daemon(url)
    client = daemon.client()
    request.addfinalizer(client.close)
    rest = [{"name": "fan", "kind": "for_each", "items": "tasks", "func": "wfsteps:square", "result": "results"},
            {"name": "merge", "func": "wfsteps:total"}]
    # The bad run's first step breaks the daemon's engine for steps named "explode" (it runs
    # in the daemon's process), so that entering its second step raises.
    faulty = [{"name": "explode", "func": "wfsteps:noop"}]

    def start(first, steps, n, token):
        return client._call({"op": "workflow_start",
                             "definition": {"name": "w", "steps": [{"name": "plan", "func": first}, *steps]},
                             "state": {"n": n, "port": gate.port, "token": token}})["run_id"]

    good = [start("wfsteps:held_plan", rest, 3, f"good{i}") for i in range(3)]
    bad = start("wfsteps:held_plan_with_a_faulty_engine", faulty, 0, "bad")
    for _ in range(4):  # the four first steps run at once, so that they finish together
        gate.arrival()
    gate.release_all()
    run = client.workflow_wait(bad, 30)
    assert (run["state"], run["reason"]["step"], run["reason"]["error"]["type"]) == ("failed", "plan", "RuntimeError")
    assert [j["state"] for s in run["steps"] for j in s["jobs"]] == ["succeeded"]
    ended = [client.workflow_wait(r, 30) for r in good]
    assert [(r["state"], r["data"].get("total")) for r in ended] == [("succeeded", 5)] * 3
    daemon.wait_for_line("the run ends failed")
    assert not [line for line in daemon.lines if "store error" in line]


def test_a_workflow_declared_in_the_config_file_starts_by_name_and_from_a_webhook(start_daemon, tmp_path):
    import socket
    import urllib.request

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cfg = tmp_path / "q.toml"
    cfg.write_text(
        '[workflows.squares]\nsteps = [{name = "plan", func = "wfsteps:plan"},'
        ' {name = "fan", kind = "for_each", items = "tasks", func = "wfsteps:square", result = "results"},'
        ' {name = "merge", func = "wfsteps:total"}]\nbudget = {max_transitions = 5}\n'
        '[hooks.go]\nworkflow = "squares"\n')
    d = start_daemon(None, "--config", str(cfg), "--http", f"127.0.0.1:{port}")
    with d.client() as q:
        run = q.workflow_wait(q.workflow("squares").start(state={"n": 3}), 30)
        assert (run["state"], run["data"]["total"]) == ("succeeded", 5)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/hooks/go", data=b'{"n": 2}',
                                     headers={"Content-Type": "application/json", "X-Delivery-Id": "d1"})
        with urllib.request.urlopen(req, timeout=10) as r:
            reply = json.loads(r.read())
        assert r.status == 202
        run = q.workflow_wait(reply["run_id"], 30)
        assert (run["state"], run["data"]["hook"]["json"], run["data"]["total"]) == ("succeeded", {"n": 2}, 285)
        with urllib.request.urlopen(req, timeout=10) as again:  # the same delivery: the same run
            assert (again.status, json.loads(again.read())["run_id"]) == (200, reply["run_id"])


def queick(d, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "queickd", *args, "--port", str(d.port)],
                          capture_output=True, text=True, timeout=60)


def test_the_cli_starts_shows_lists_and_cancels_runs(daemon, tmp_path):
    cfg_run = daemon.client().workflow("w").then(wfsteps.mark).start(state={"marks": 1})
    with daemon.client() as q:
        q.workflow_wait(cfg_run, 30)
    out = queick(daemon, "workflow", "show", str(cfg_run))
    assert out.returncode == 0, out.stderr
    assert "succeeded" in out.stdout and "transitions" in out.stdout and "1/" not in out.stderr
    listed = queick(daemon, "workflows", "--state", "succeeded", "--json")
    assert [r["run_id"] for r in json.loads(listed.stdout)] == [cfg_run]
    bad = queick(daemon, "workflow", "start", "nope", "--state", "{}")
    assert bad.returncode != 0 and "no workflow named" in bad.stderr
    gone = queick(daemon, "workflow", "cancel", str(cfg_run))
    assert gone.returncode != 0 and "succeeded" in gone.stderr


def test_stats_metrics_and_the_status_page_show_runs_by_state_and_budget_stops_by_budget(start_daemon):
    import socket
    import urllib.request

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    d = start_daemon(None, "--http", f"127.0.0.1:{port}")
    with d.client() as q:
        q.workflow_wait(q.workflow("w").for_each("xs", wfsteps.square).budget(max_for_each_items=1)
                        .start(state={"xs": [1, 2]}), 30)
        q.workflow_wait(q.workflow("ok").then(wfsteps.noop).start(), 30)
        stats = q.stats()
    assert (stats["workflows"]["runs"]["budget_exceeded"], stats["workflows"]["runs"]["succeeded"]) == (1, 1)
    assert stats["workflows"]["budget_stops"] == {"max_for_each_items": 1}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert 'queickd_workflow_runs{state="budget_exceeded"} 1' in metrics
    assert 'queickd_workflow_budget_stops{budget="max_for_each_items"} 1' in metrics
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
        page = r.read().decode()
    assert "<h2>Workflows</h2>" in page and "<td>max_for_each_items</td><td>1</td>" in page


def test_the_builder_names_steps_after_their_functions_and_copies_job_fields():
    from queickd import JobQueue

    b = JobQueue("127.0.0.1", 1).workflow("w").then(wfsteps.mark).then("wfsteps:mark", priority=2, key="k") \
        .for_each("xs", wfsteps.square, "ys", mode="quorum", n=2).budget(max_transitions=3)
    d = b.definition()
    assert [s["name"] for s in d["steps"]] == ["mark", "mark_2", "square"]
    assert (d["steps"][1]["priority"], d["steps"][1]["key"], d["steps"][2]["n"]) == (2, "k", 2)
    assert d["budget"] == {"max_transitions": 3}


def test_a_declared_workflow_that_could_not_start_stops_the_daemon_at_start_up(tmp_path):
    from helpers import JOBS_DIR

    cfg = tmp_path / "q.toml"
    cfg.write_text('[workflows.broken]\nsteps = [{name = "a", kind = "sometimes", func = "wfsteps:noop"}]\n')
    out = subprocess.run([sys.executable, "-m", "queickd", "run", "--config", str(cfg), "--port", "0",
                          "--store", f"sqlite:///{tmp_path / 'q.db'}", "--app-dir", str(JOBS_DIR)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 78 and "workflows.broken: step a: unknown kind 'sometimes'" in out.stderr


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_fan_out_item_gets_the_run_state_its_job_does_not_store(client, isolation):
    run_id = (client.workflow("scaled").for_each("xs", wfsteps.times_factor, "ys", isolation=isolation)
              .start(state={"xs": [1, 2, 3], "factor": 10, "padding": "x" * 10_000}))
    run = client.workflow_wait(run_id, 30)
    assert run["state"] == "succeeded" and run["data"]["ys"] == [10, 20, 30]
    items = next(s for s in run["steps"] if s["name"] == "times_factor")["jobs"]
    assert sorted(client.get(j["job_id"])["args"][0] for j in items) == [1, 2, 3]
    assert all(client.get(j["job_id"])["args"][1] is None for j in items)


def test_a_loop_over_a_large_state_reads_it_each_pass_without_storing_it_each_pass(client):
    run_id = (client.workflow("counted").then(wfsteps.count_up, name="count")
              .start(state={"until": 5, "padding": "x" * 10_000}))
    run = client.workflow_wait(run_id, 30)
    assert run["state"] == "succeeded" and run["data"]["count"] == 5
    jobs = next(s for s in run["steps"] if s["name"] == "count")["jobs"]
    assert len(jobs) == 5 and all(client.get(j["job_id"])["args"] == [None] for j in jobs)


def test_a_step_run_in_a_process_reads_its_idempotency_key(client):
    run_id = client.workflow("keyed").then(wfsteps.key_of_my_job, isolation="process").start()
    run = client.workflow_wait(run_id, 30)
    assert run["state"] == "succeeded" and run["data"]["key"] == f"wf:{run_id}:0:0"
