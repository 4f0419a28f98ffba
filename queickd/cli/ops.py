"""`queick stats/status/top/crons`: the operator's views of a running daemon, one function
per command, each given the parsed options and a connected client."""

from __future__ import annotations

import argparse
import json
import sys

from ..client import JobQueue
from ..ui import statusview
from .remote import run_client
from .show import fmt_time, print_budgets, print_stats


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
        print("no budgets configured ([budgets.pools] and [budgets.groups] in the config file)")
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
    for c in out:
        print(f"{c['name']}: {c['schedule']}  next {fmt_time(c['next_run_at'])}"
              f"  last {fmt_time(c['last_fired_at'])}  folded {c['folded']}")
    return 0
