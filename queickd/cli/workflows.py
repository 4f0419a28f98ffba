"""`queick workflows` and `queick workflow show|cancel|start`: workflow runs from the
command line, one function per command, each given the parsed options and a client."""

from __future__ import annotations

import argparse
import json

from ..client import JobQueue
from ..ui.text import local_time


def workflows(a: argparse.Namespace, q: JobQueue) -> int:
    runs = q.workflows(a.state, a.limit)
    if a.json:
        print(json.dumps(runs))
        return 0
    if not runs:
        print(f"no {a.state + ' ' if a.state else ''}workflow runs")
    for r in runs:
        why = f"  ({r['reason']['message']})" if r.get("reason") else ""
        print(f"{r['run_id']:>6}  {r['name']}  {r['state']}  step {r['step'] or '-'}"
              f"  started {local_time(r['created_at'])}{why}")
    return 0


def _print_run(run: dict) -> None:
    print(f"run {run['run_id']}  {run['name']}  {run['state']}")
    if run.get("reason"):
        print(f"  reason: {run['reason'].get('message')}")
    print(f"  step: {run['step'] or '-'} (loop {run['loop']})  state: {run['state_bytes']} bytes")
    print("  budget (used/limit):")
    for name, b in run["budget"].items():
        print(f"    {name}: {b['used']}/{'-' if b['limit'] is None else b['limit']}")
    print("  steps:")
    for s in run["steps"]:
        by_state: dict[str, int] = {}
        for j in s["jobs"]:
            by_state[j["state"]] = by_state.get(j["state"], 0) + 1
        summary = ", ".join(f"{n} {st}" for st, n in sorted(by_state.items())) or "no jobs"
        print(f"    {s['index']}. {s['name']}: {summary}")
    for c in run.get("children", []):
        print(f"  child run {c['run_id']} {c['name']}: {c['state']}")


def show(a: argparse.Namespace, q: JobQueue) -> int:
    run = q.workflow_get(a.run_id)
    print(json.dumps(run)) if a.json else _print_run(run)
    return 0


def cancel(a: argparse.Namespace, q: JobQueue) -> int:
    run = q.workflow_cancel(a.run_id)
    print(json.dumps(run)) if a.json else print(f"run {run['run_id']} cancelled")
    return 0


def start(a: argparse.Namespace, q: JobQueue) -> int:
    run_id = q.workflow(a.name).start(state=a.state, idempotency_key=a.idempotency_key)
    if a.wait is not None:
        run = q.workflow_wait(run_id, a.wait)
        print(json.dumps(run)) if a.json else _print_run(run)
        return 0 if run["state"] == "succeeded" else 1
    print(json.dumps({"run_id": run_id}) if a.json else run_id)
    return 0
