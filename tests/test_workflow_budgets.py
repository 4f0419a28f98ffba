"""Every workflow run has budgets, whoever started it: the defaults (core/workflow/model.py),
the operator's (daemon flags and config keys `workflow-max-*`), a definition's own (a
client's may lower them; one the config file declares may raise them). Through real daemons."""

from __future__ import annotations

import subprocess
import sys

import pytest
import wfsteps
from helpers import JOBS_DIR

from queickd import QueueError
from queickd.core.workflow.model import DEFAULT_BUDGET


def test_a_self_jumping_step_stops_at_the_default_transition_budget(client):
    run_id = client.workflow("spin").then(wfsteps.count_up, name="count").start(state={"until": 10**9})
    run = client.workflow_wait(run_id, 300)
    assert run["state"] == "budget_exceeded"
    limit = DEFAULT_BUDGET["max_transitions"]
    assert run["reason"]["budget"] == "max_transitions" and run["reason"]["limit"] == limit
    assert run["data"]["count"] == limit  # every transition ran its step once, none past the budget
    assert run["budget"]["transitions"] == {"limit": limit, "used": limit + 1}


def test_state_past_its_budget_fails_the_run(client):
    run_id = client.workflow("fat").then(wfsteps.grow_by).start(state={"by": 60_000})
    run = client.workflow_wait(run_id, 120)
    limit = DEFAULT_BUDGET["max_state_bytes"]
    assert run["state"] == "budget_exceeded", run["reason"]
    assert (run["reason"]["budget"], run["reason"]["limit"]) == ("max_state_bytes", limit)
    assert run["reason"]["usage"] > limit >= run["state_bytes"]  # the state kept is the last within it


def test_a_run_shows_the_default_budgets_its_definition_did_not_name(client):
    run = client.workflow_wait(client.workflow("w").then(wfsteps.noop).budget(max_transitions=5).start(), 30)
    assert run["budget"]["transitions"]["limit"] == 5
    assert run["budget"]["state_bytes"]["limit"] == DEFAULT_BUDGET["max_state_bytes"]
    assert run["budget"]["for_each_items"]["limit"] == DEFAULT_BUDGET["max_for_each_items"]
    assert run["budget"]["started_workflows"]["limit"] == DEFAULT_BUDGET["max_started_workflows"]
    assert run["budget"]["cost_units"]["limit"] is None


def test_operator_config_sets_default_budgets(start_daemon, tmp_path):
    cfg = tmp_path / "q.toml"
    cfg.write_text("workflow-max-transitions = 7\nworkflow_max_for_each_items = 3\n")
    d = start_daemon(None, "--config", str(cfg), "--workflow-max-cost-units", "50")
    with d.client() as q:
        run = q.workflow_wait(q.workflow("spin").then(wfsteps.count_up, name="count").start(), 30)
        assert (run["state"], run["reason"]["budget"], run["reason"]["limit"]) == \
            ("budget_exceeded", "max_transitions", 7)
        assert run["data"]["count"] == 7
        assert run["budget"]["cost_units"]["limit"] == 50
        fan = q.workflow_wait(q.workflow("fan").for_each("xs", wfsteps.square).start(state={"xs": [1, 2, 3, 4]}), 30)
        assert (fan["state"], fan["reason"]["budget"]) == ("budget_exceeded", "max_for_each_items")


def test_a_clients_definition_cannot_raise_a_budget_past_the_operators(start_daemon):
    d = start_daemon(None, "--workflow-max-transitions", "7")
    with d.client() as q:
        with pytest.raises(QueueError) as e:
            q.workflow("spin").then(wfsteps.count_up, name="count").budget(max_transitions=8).start()
        assert e.value.code == "not_allowed" and "max_transitions 8 is above the operator's 7" in e.value.message
        child = {"name": "child", "steps": [{"name": "a", "func": "wfsteps:noop"}], "budget": {"max_transitions": 9}}
        with pytest.raises(QueueError) as e:
            q._call({"op": "workflow_start", "state": {},
                     "definition": {"name": "parent", "steps": [{"name": "c", "workflow": child}]}})
        assert e.value.code == "not_allowed" and q.workflows() == []


def test_definition_overrides_a_default_budget(start_daemon, tmp_path):
    cfg = tmp_path / "q.toml"
    cfg.write_text('workflow-max-transitions = 7\n'
                   '[workflows.long]\nsteps = [{name = "count", func = "wfsteps:count_up"}]\n'
                   'budget = {max_transitions = 12}\n')
    d = start_daemon(None, "--config", str(cfg))
    with d.client() as q:
        raised = q.workflow_wait(q.workflow("long").start(state={"until": 10}), 30)  # the operator's own: above 7
        assert (raised["state"], raised["data"]["count"]) == ("succeeded", 10)
        assert raised["budget"]["transitions"] == {"limit": 12, "used": 10}
        lowered = q.workflow_wait(q.workflow("short").then(wfsteps.count_up, name="count").budget(max_transitions=3)
                                  .start(state={"until": 10}), 30)
        assert (lowered["state"], lowered["reason"]["limit"], lowered["data"]["count"]) == ("budget_exceeded", 3, 3)


def test_a_negative_operator_budget_stops_the_daemon_at_start_up(tmp_path):
    out = subprocess.run([sys.executable, "-m", "queickd", "run", "--port", "0", "--workflow-max-state-bytes", "-1",
                          "--store", f"sqlite:///{tmp_path / 'q.db'}", "--app-dir", str(JOBS_DIR)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 78 and "workflow_max_state_bytes must not be negative" in out.stderr


def _memory_mb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in MB."""
    with open(f"/proc/{pid}/status") as f:
        return {line.split(":")[0]: int(line.split()[1]) // 1024 for line in f if line.startswith(("VmRSS", "VmHWM"))}


def test_run_state_memory_is_given_back(start_daemon):
    # Ten passes of a fan-out whose 50 results make a 3 MB state, each replaced by the next:
    # the daemon held 88 MB of them after the run had ended; now what it held goes back.
    d = start_daemon(None, "--sweep", "1", "--workflow-max-state-bytes", "8000000")
    definition = {"name": "churn", "steps": [
        {"name": "fan", "kind": "for_each", "items": "xs", "func": "wfsteps:big_item"},
        {"name": "again", "func": "wfsteps:again"}]}
    with d.client() as q:
        before = _memory_mb(d.proc.pid)["VmRSS"]
        run_id = q._call({"op": "workflow_start", "definition": definition,
                          "state": {"xs": list(range(50)), "by": 60_000, "passes": 10}})["run_id"]
        assert q.workflow_wait(run_id, 300)["state"] == "succeeded"
        peak = _memory_mb(d.proc.pid)["VmHWM"]
        swept = len([line for line in d.lines if "swept; next sweep" in line])
        d.wait_for_lines("swept; next sweep", swept + 2, timeout=30)  # a whole sweep since the end
    after = _memory_mb(d.proc.pid)["VmRSS"]
    assert peak - before > 20  # the run did cost memory while it ran
    assert after - before < 50, (before, peak, after)
