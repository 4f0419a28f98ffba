"""`queick stats/status/top/crons/cron delete/drain`: the operator's views of a running daemon, one function
per command, each given the parsed options and a connected client."""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..client import JobQueue
from ..ui import statusview
from ..ui.text import local_time
from .options import fmt_duration
from .remote import run_client
from .show import print_budgets, print_stats


def stats(a: argparse.Namespace, q: JobQueue) -> int:
    out = q.stats()
    print(json.dumps(out)) if a.json else print_stats(out)
    return 0


def budgets(a: argparse.Namespace, q: JobQueue) -> int:
    """`queick budgets`: each budget's limit, what runs against it and what waits for it."""
    out = q.stats()["budgets"]
    if a.json:
        print(json.dumps(out))
    elif not out:
        print("no budgets in force ([budgets.pools] and [budgets.groups] in the config file)")
    else:
        print_budgets(out)
    return 0


def status(a: argparse.Namespace, q: JobQueue) -> int:
    out = q.stats(detail=True)
    print(json.dumps(out) if a.json else "\n".join(statusview.lines(out, 200)))
    return 0


def top(a: argparse.Namespace) -> int:
    """`queick top`: checked before connecting, since a live view needs a terminal to draw on."""
    if a.json:
        print("queick top: --json is not for a live view; use 'queick status --json'", file=sys.stderr)
        return 2
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print("queick top: needs a terminal; use 'queick status' (or 'queick status --json') "
              "for a one-shot picture", file=sys.stderr)
        return 2
    return run_client(_top, a)


def _top(a: argparse.Namespace, q: JobQueue) -> int:
    import curses

    try:
        return statusview.top(lambda: q.stats(detail=True))
    except curses.error as e:  # a terminal curses cannot drive (TERM unset or unknown, ...)
        print(f"queick top: cannot draw on this terminal ({e}); try TERM=xterm or 'queick status'",
              file=sys.stderr)
        return 2


def crons(a: argparse.Namespace, q: JobQueue) -> int:
    out = q.crons()
    if a.json:
        print(json.dumps(out))
        return 0
    if not out:
        print("no recurring jobs")
        return 0
    rows = [[c["name"], schedule_text(c["schedule"]), c["func"], c.get("pool") or "default",
             local_time(c["next_run_at"]), local_time(c["last_fired_at"]), str(c["folded"])] for c in out]
    head = ["NAME", "SCHEDULE", "FUNC", "POOL", "NEXT", "LAST", "FOLDED"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    return 0


def schedule_text(s: dict) -> str:
    """{"cron": "*/5 * * * *"} -> '*/5 * * * *'; {"every": 300, ...} -> 'every 5m'."""
    if "cron" in s:
        return s["cron"]
    return f"every {fmt_duration(s['every'])}"


def cron_delete(a: argparse.Namespace, q: JobQueue) -> int:
    q.cron_delete(a.name)
    print(json.dumps({"deleted": a.name}) if a.json else f"deleted cron {a.name}")
    return 0


def drain(a: argparse.Namespace, q: JobQueue) -> int:
    """Drain (or with --off end it); waits, a request of at most 10 s at a time, for idle."""
    if a.off:
        out = q.drain(off=True)
        print(json.dumps(out) if a.json else "drain ended: jobs start again")
        return 0
    deadline = time.monotonic() + a.timeout
    out = q.drain(0)
    told = False
    while not out["idle"] and (left := deadline - time.monotonic()) > 0:
        if not told and not a.json:
            print(f"draining: no new jobs start; waiting for {out['running']} running job(s)", file=sys.stderr)
            told = True
        out = q.drain(min(10.0, left))
    if a.json:
        print(json.dumps(out))
    elif out["idle"]:
        print("idle: nothing runs here; no new job starts until 'queick drain --off' or a restart")
    else:
        print(f"still busy after {fmt_duration(a.timeout)}: {out['running']} job(s) running; the drain goes on")
    return 0 if out["idle"] else 1
