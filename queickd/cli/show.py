"""How `queick` prints jobs, pauses and stats as text. Only formats what it is given; never
talks to a daemon."""

from __future__ import annotations

import json
from typing import Any

from ..ui import statusview
from ..ui.text import (
    ERROR_SHOWN,
    STALLED,
    local_time,
    one_line,
    pause_cause,
    progress_text,
    stalled_text,
    unserved,
)


def print_jobs(jobs: list[dict[str, Any]]) -> None:
    print(f"{'ID':>8}  {'STATE':<15} {'TRIES':>5}  {'RUN AT':<19}  FUNC / ERROR")
    for j in jobs:
        err = j.get("error") or {}
        tail = f"  [{err.get('type')}: {one_line(err.get('message'), ERROR_SHOWN)}]" if err else ""
        tries, note = _tries(j)
        if j["state"] == "running" and j.get("progress"):  # how far the run has got
            note += f"  {progress_text(j['progress'], 40)}"
        stalled = stalled_text(j)  # running, but no sign of life for its stalled_after
        if stalled:
            note += f"  ({stalled})"
        state = STALLED if stalled else j["state"]
        print(f"{j['id']:>8}  {state:<15} {tries:>5}  {local_time(j['run_at']):<19}  {j['func']}{note}{tail}")


def _tries(j: dict[str, Any]) -> tuple[str, str]:
    """The TRIES cell: the runs that count against max_attempts, which runs lost to a crash
    of their daemon or worker (re-queued as orphans) do not (core/fate.py), and a note
    saying what the cell leaves out or why it is past the limit."""
    lost = j.get("orphaned") or 0  # a daemon of an earlier version may not send it
    counted, limit = j["attempts"] - lost, j["max_attempts"]
    notes = [f"+{lost} run{'s' if lost > 1 else ''} lost to a crash, not counted"] if lost else []
    if counted > limit:  # fate gives these failures a few runs whatever the policy
        notes.append("retried past its limit after network or resource failures")
    return f"{counted}/{limit}", f"  ({'; '.join(notes)})" if notes else ""


def print_pauses(pauses: list[dict[str, Any]]) -> None:
    for p in pauses:
        probe = ("until resumed" if p.get("probe_at") is None
                 else f"next probe {local_time(p['probe_at'])}, trip {p.get('trips', 0)}")
        print(f"PAUSED {p['kind']} {p['name']} since {local_time(p['paused_at'])} "
              f"{pause_cause(p, ERROR_SHOWN)}  ({probe}; 'queick resume')")


def _block(text: str) -> None:
    print("\n".join("                  " + line for line in text.splitlines()))


def print_job(job: dict[str, Any]) -> None:
    for k, v in job.items():
        if k == "error" and v:
            print(f"{'error':>16}: {v.get('type')}: {v.get('message')}")
            if v.get("traceback"):
                _block(v["traceback"])
            if v.get("output"):  # a job finished before output was a field of its own
                print(f"{'output':>16}:")
                _block(v["output"])
        elif k == "output" and v:
            print(f"{'output':>16}:")
            _block(v)
        elif k == "progress" and v:
            print(f"{'progress':>16}: {progress_text(v)}  (said {local_time(v.get('at'))}, attempt {v.get('attempt')})")
        elif k == "stalled_at" and v is not None:
            print(f"{k:>16}: {local_time(v)}" + ("  (running, stalled: no progress for its stalled_after)"
                                                if job.get("state") == "running" else ""))
        elif k in ("run_at", "created_at", "started_at", "finished_at", "cron_until"):
            print(f"{k:>16}: {local_time(v)}")
        else:
            print(f"{k:>16}: {json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v}")


def print_budgets(budgets: list[dict[str, Any]]) -> None:
    for b in budgets:
        print(f"budget {b['kind']} {b['name']}: {b['running']:g}/{b['limit']:g} units running"
              f" ({b['running_jobs']} jobs), {b['waiting']:g} waiting ({b['waiting_jobs']} jobs)")


def print_rate_keys(keys: list[dict[str, Any]], now: float | None) -> None:
    for k in keys:
        blocked = f", blocked until {local_time(k['blocked_until'])}" if k.get("blocked_until") else ""
        due = "now" if now is not None and k["next_start"] <= now else local_time(k["next_start"])
        print(f"rate {k['key']}: {k['used']}/{k['limit']} starts in {k['per']:g} s, next start {due}{blocked}")


def print_stats(s: dict[str, Any]) -> None:
    print(f"queickd {s['version']}  store {s['store']}  up {s['uptime']:.0f} s")
    w = s["workers"]
    stopping = f" ({w['stopping']} stopping)" if w.get("stopping") else ""
    print(f"workers: {w['busy']}/{w['total']} busy{stopping}   enqueued {s['enqueued']} in {s['commits']} commits"
          f"   completed {s['completed']}   failed attempts {s['failed']}"
          + ("   DRAINING: no new job starts" if s.get("draining") else ""))
    last = w.get("last_resize")
    if w.get("max", w["total"]) != w.get("min", w["total"]):
        print(f"pool size: {w['size']} (min {w['min']}, max {w['max']}, idle grace {w['idle_grace']:g} s)"
              + (f"   last resize {last['from']} -> {last['to']} at {local_time(last['at'])}: {last['reason']}"
                 if last else ""))
    sch = s["scheduler"]
    print(f"scheduler: {'alive' if sch['alive'] else 'STOPPED'}, last fired {local_time(sch['last_fired_at'])}"
          f"   crons: {s['crons']}")
    net = s.get("network")
    if net is None:
        print("network: no checker configured")
    else:
        print(f"network: {net['state']} since {local_time(net['since'])}   checker "
              f"{'alive' if net['checker_alive'] else 'DEAD'} (pid {net['checker_pid']}, "
              f"{net['restarts']} restarts), probing {net['target']}")
        if net.get("error"):
            print(f"network checker error: {net['error']}")
    hour = s.get("last_hour")
    if hour is not None:  # from the store: every daemon and worker of the fleet
        runs = hour["completed"] + hour["failed"]
        print(f"last hour: {runs} runs, {hour['failed']} failed, {hour['seconds']:.1f} s of work"
              + "".join(f"   {m['member']} {m['completed'] + m['failed']}/{m['failed']} failed/{m['seconds']:.1f} s"
                        for m in hour["members"]))
    sb = s.get("sandbox")
    if sb is not None:
        z = sb["zygote"]
        zygote = f"alive (pid {z['pid']})" if z["alive"] else "not running"
        print(f"runs: thread {sb['runs']['thread']}  process {sb['runs']['process']}   limit kills: "
              + "  ".join(f"{k} {n}" for k, n in sb["kills"].items()) + f"  crashed {sb['crashed']}"
              f"   zygote {zygote}, {z['restarts']} restarts")
        lim = sb.get("limits")
        if lim:
            print(f"process jobs' memory limits: by {lim['memory']}"
                  + (f" ({lim['reason']})" if lim["reason"] else f", a group per job under {', '.join(lim['groups'])}"))
    gc = s.get("collector")
    if gc is not None:  # a daemon of an earlier version has none
        print(f"collector: young generation every {gc['thresholds'][0]} allocations, {gc['frozen']} objects frozen,"
              f" collections {'/'.join(map(str, gc['collections']))} (young/middle/oldest)")
    print("jobs: " + "  ".join(f"{k} {v}" for k, v in s["counts"].items()))
    origin = statusview.origin_line(s)
    if origin is not None:
        print("  " + origin)
    ev = s["events"]
    print(f"events: pending {ev['pending']}  dead {ev['dead']}   refused requests {s['refused']}"
          f"   cron ticks folded {s['crons_folded']}")
    for k in s["waiting_by_key"]:
        print(f"  key {k['key']}: {k['waiting']} waiting, oldest due {local_time(k['oldest_run_at'])}")
    print_pauses(s["paused"])
    for name, p in (s.get("pools") or {}).items():
        alarm = "   NO WORKERS: its jobs wait" if unserved(p) else ""
        print(f"pool {name}: {p['waiting']} waiting, {p['workers']} worker slot(s) alive{alarm}")
    print_budgets(s.get("budgets") or [])
    print_rate_keys(s.get("rate_keys") or [], s.get("now"))
    for k in s.get("fair_keys") or []:
        print(f"fair key {k['key']} (pool {k['pool']}): {k['waiting']} waiting")
    m = s.get("memory")
    if m:
        deferred = ", ".join(f"{r} {n}" for r, n in sorted(m["deferred"].items())) or "none"
        cap = "" if m["max_rss_mb"] is None else f", max rss {m['max_rss_mb']:g} MB"
        print(f"memory: free memory read from {m['source']}, reserve {m['reserve_mb']:g} MB{cap}"
              f"   deferred: {deferred}")
    for w in s.get("fleet") or []:
        state = "REFUSED: " + w["refused"] if w["refused"] else "alive" if w["alive"] else "GONE"
        print(f"  {w['kind']} {w['host']}:{w['pid']} pools {','.join(w['pools'])} queickd {w['version']}"
              f"  running {w['running']}/{w['slots']}  last beat {w['silent_for']:.0f} s ago  {state}")
