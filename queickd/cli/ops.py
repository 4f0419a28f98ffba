"""`queick stats/status/top/crons`: the operator's views of a running daemon, one function
per command, each given the parsed options and a connected client."""

from __future__ import annotations

import argparse
import json

from ..client import JobQueue
from ..ui import statusview
from .show import fmt_time, print_stats


def stats(a: argparse.Namespace, q: JobQueue) -> int:
    out = q.stats()
    print(json.dumps(out)) if a.json else print_stats(out)
    return 0


def status(a: argparse.Namespace, q: JobQueue) -> int:
    out = q.stats(detail=True)
    print(json.dumps(out) if a.json else "\n".join(statusview.lines(out, 200)))
    return 0


def top(a: argparse.Namespace, q: JobQueue) -> int:
    return statusview.top(lambda: q.stats(detail=True))


def crons(a: argparse.Namespace, q: JobQueue) -> int:
    out = q.crons()
    if a.json:
        print(json.dumps(out))
        return 0
    for c in out:
        print(f"{c['name']}: {c['schedule']}  next {fmt_time(c['next_run_at'])}"
              f"  last {fmt_time(c['last_fired_at'])}  folded {c['folded']}")
    return 0
