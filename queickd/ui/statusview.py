"""`queick status` (a terminal summary) and `queick top` (a live view, curses).

Both draw the detailed `stats` reply, fetched over the TCP protocol, so they work against
a remote daemon as well as a local one and never open the store. `lines()` is the one
layout; status prints it once, top redraws it every second until `q` or Ctrl-C.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .text import ago, local_time, one_line, pause_cause, probe_text, progress_text, stalled_text, unserved


def _terse_ago(now: float, t: float | None) -> str:
    return ago(now, t, sep="")


_SPARK = " ▁▂▃▄▅▆▇█"


def sparkline(values: list[int]) -> str:
    top = max(values, default=0)
    if top <= 0:
        return _SPARK[0] * len(values)
    return "".join(_SPARK[min(len(_SPARK) - 1, -(-v * (len(_SPARK) - 1) // top))] for v in values)


def origin_line(s: dict[str, Any]) -> str | None:
    """Who enqueued the jobs, on a store where applications enqueue in their own
    transactions (PostgreSQL: the `stats` reply's `direct`); None elsewhere."""
    direct = s.get("direct")
    if direct is None:
        return None
    return (f"by origin: {sum(s['counts'].values()) - sum(direct.values())} through a daemon, "
            f"{sum(direct.values())} in applications' transactions"
            + "".join(f"   direct {k} {v}" for k, v in direct.items()))


def lines(s: dict[str, Any], width: int = 100) -> list[str]:
    """The status picture as text lines, most important first."""
    now = s.get("now") or time.time()
    w, c, sch, net, ev = s["workers"], s["counts"], s["scheduler"], s.get("network"), s["events"]
    waiting = c["scheduled"] + c["queued"] + c["waiting_network"]
    out = [
        f"queickd {s['version']}   up {_terse_ago(now, now - s['uptime'])}   store {s['store']}",
        f"workers  {w['busy']} busy / {w['total'] - w['busy']} idle   running {c['running']}   "
        f"waiting {waiting} (queued {c['queued']}, scheduled {c['scheduled']}, "
        f"for network {c['waiting_network']})"
        + ("   DRAINING: no new job starts ('queick drain --off')" if s.get("draining") else ""),
        f"oldest   queued job waiting {_terse_ago(now, s.get('oldest_queued_at'))}   "
        f"outbox pending {ev['pending']} (oldest {_terse_ago(now, s.get('outbox_oldest_pending_at'))})",
        f"dead     {c['dead']} jobs, {ev['dead']} events   scheduler "
        f"{'alive' if sch['alive'] else 'STOPPED'} (last fired "
        f"{_terse_ago(now, sch['last_fired_at']) + ' ago' if sch['last_fired_at'] else 'never'})",
    ]
    if net is None:
        out.append("network  no checker configured")
    else:
        out.append(f"network  {net['state']} since {_terse_ago(now, net['since'])} ago   checker "
                   f"{'alive' if net['checker_alive'] else 'DEAD'}, probing {net['target']}")
        if net.get("error"):
            error = one_line(net["error"])
            out.append(f"network  {error.upper()[:1]}{error[1:]}")
    out.extend(upstream_lines(s.get("upstream"), now))
    history = s.get("history") or []
    if history:
        done = [h["completed"] + h["failed"] for h in history]
        out.append(f"runs/min {sparkline(done)}  {sum(done)} in the last hour "
                   f"({sum(h['failed'] for h in history)} failed)")
        depth = [h["depth"] or 0 for h in history]
        out.append(f"waiting  {sparkline(depth)}  now {waiting}, peak {max([*depth, waiting])}")
    out.extend(member_lines(s.get("last_hour")))
    out.append(f"totals   enqueued {s['enqueued']}  completed {s['completed']}  failed runs {s['failed']}  "
               f"refused {s['refused']}")
    origin = origin_line(s)
    if origin is not None:
        out.append(f"jobs     {origin}")
    pools = s.get("pools") or {}
    if pools:
        out.append("")
        out.append(f"{'POOL':<30} {'WAITING':>8} {'WORKERS':>8}")
        for name, p in pools.items():
            alarm = "  NO LIVE WORKER: its jobs wait" if unserved(p) else ""
            out.append(f"{name[:30]:<30} {p['waiting']:>8} {p['workers']:>8}{alarm}")
    for wk in s.get("fleet") or []:
        state = "REFUSED: " + wk["refused"] if wk["refused"] else "alive" if wk["alive"] else "GONE"
        out.append(f"  {wk['kind']} {wk['host']}:{wk['pid']} pools {','.join(wk['pools'])}  running "
                   f"{wk['running']}/{wk['slots']}  beat {wk['silent_for']:.0f}s ago  {state}")
    out.extend(token_lines(s.get("tokens"), now))
    if s["waiting_by_key"]:
        out.append("")
        out.append(f"{'KEY':<30} {'WAITING':>8}  OLDEST DUE")
        for k in s["waiting_by_key"]:
            due = k["oldest_run_at"]
            when = f"{_terse_ago(now, due)} ago" if due <= now else f"in {_terse_ago(due, now)}"
            held = s.get("key_blocks", {}).get(k["key"])
            out.append(f"{k['key'][:30]:<30} {k['waiting']:>8}  {when}" + (f"  HELD: {held}" if held else ""))
    if s.get("rate_keys"):
        out.append("")
        out.append(f"{'RATE KEY':<30} {'USED':>6}/{'LIMIT':<6} {'PER':>8}  NEXT START")
        for k in s["rate_keys"]:
            nxt = "now" if k["next_start"] <= now else f"in {_terse_ago(k['next_start'], now)}"
            blocked = f"  BLOCKED until {local_time(k['blocked_until'])}" if k.get("blocked_until") else ""
            out.append(f"{k['key'][:30]:<30} {k['used']:>6}/{k['limit']:<6} {k['per']:>7g}s  {nxt}{blocked}")
    if s.get("fair_keys"):
        out.append("")
        out.append(f"{'FAIR KEY':<30} {'POOL':<12} {'WAITING':>8}")
        for k in s["fair_keys"]:
            out.append(f"{k['key'][:30]:<30} {k['pool'][:12]:<12} {k['waiting']:>8}")
    if s["paused"]:
        out.append("")
        for p in s["paused"]:
            out.append(f"PAUSED {p['kind']} {p['name']} {_terse_ago(now, p['paused_at'])} ago "
                       f"{pause_cause(p)}{probe_text(p, now)}")
    if s.get("running"):
        out.append("")
        out.append(f"{'RUNNING':>8}  {'FOR':>6}  FUNC [KEY]")
        for j in s["running"]:
            key = f" [{j['key']}]" if j["key"] else ""
            said = "  ".join(t for t in (stalled_text(j), progress_text(j.get("progress"), 40)) if t)
            out.append(f"{j['id']:>8}  {_terse_ago(now, j['started_at']):>6}  {j['func']}{key}"
                       + (f"  {said}" if said else ""))
    if s.get("dead_jobs") or s.get("dead_events"):
        out.append("")
        out.append(f"{'DEAD':>8}  {'AGO':>6}  FUNC: ERROR")
        for j in s.get("dead_jobs", []):
            out.append(f"{j['id']:>8}  {_terse_ago(now, j['finished_at']):>6}  {j['func']}: "
                       f"{j['error']['type']}: {one_line(j['error']['message'])}")
        for e in s.get("dead_events", []):
            out.append(f"{'event':>8}  {_terse_ago(now, e['created_at']):>6}  {e['func']}: {e['event_id']}: "
                       f"{one_line(e['last_error'])}")
    return [line[:width] for line in out]


def top(fetch: Callable[[], dict[str, Any]], interval: float = 1.0) -> int:
    """Redraw `fetch()` every `interval` s until q or Ctrl-C. Returns the exit status."""
    import curses

    def loop(scr: Any) -> None:
        curses.curs_set(0)
        scr.timeout(int(interval * 1000))
        while True:
            try:
                body = lines(fetch(), 1000)
            except (OSError, ConnectionError) as e:  # keep trying: the daemon may be restarting
                body = [f"cannot reach queickd: {e}", "retrying every second; q quits"]
            rows, cols = scr.getmaxyx()
            scr.erase()
            footer = time.strftime("%H:%M:%S") + "  q: quit"
            for y, text in enumerate(body[: rows - 1]):
                scr.addnstr(y, 0, text, cols - 1)
            scr.addnstr(rows - 1, 0, footer, cols - 1, curses.A_REVERSE)
            scr.refresh()
            if scr.getch() in (ord("q"), ord("Q")):
                return

    try:
        curses.wrapper(loop)
    except KeyboardInterrupt:
        pass
    return 0


def member_lines(hour: dict[str, Any] | None) -> list[str]:
    """The last hour's runs per member (daemon or worker) beside the fleet's, when several ran."""
    if not hour or len(hour["members"]) < 2:
        return []
    out = []
    for m in hour["members"]:
        runs = m["completed"] + m["failed"]
        out.append(f"  {m['member'][:28]:<28} {runs:>6} runs  {m['failed']:>5} failed  "
                   f"{m['seconds'] / runs if runs else 0:.3f} s/run")
    return out


def token_lines(tokens: list[dict[str, Any]] | None, now: float) -> list[str]:
    """The named tokens (--token-file): each one's connections and jobs enqueued since the
    daemon started, when last seen, and REVOKED for one removed from the file since."""
    if not tokens:
        return []
    out = ["", f"{'TOKEN':<30} {'CONNECTIONS':>11} {'ENQUEUED':>8}  LAST SEEN"]
    for t in tokens:
        seen = f"{_terse_ago(now, t['last_seen'])} ago" if t["last_seen"] else "never"
        out.append(f"{t['name'][:30]:<30} {t['connections']:>11} {t['enqueued']:>8}  {seen}"
                   + ("  REVOKED" if t["revoked"] else ""))
    return out


def upstream_lines(up: dict[str, Any] | None, now: float) -> list[str]:
    """An edge daemon's forwarding: the link, the held backlog (slow: it shrinks; stuck: its
    oldest grows and the last forward ages) and what the link last said."""
    if up is None:
        return []
    last = f"{_terse_ago(now, up['last_forward_at'])} ago" if up["last_forward_at"] else "never"
    oldest = "-" if up["oldest_held_age"] is None else _terse_ago(now, now - up["oldest_held_age"])
    out = [f"upstream {up['link'].upper() if up['link'] not in ('up', 'idle') else up['link']} {up['url']}   "
           f"held {up['held']} ({up['held_bytes']} B of {up['max_held_bytes']})   oldest {oldest}   "
           f"last forward {last}   forwarded {up['forwarded']}  refused {up['refused']}"]
    if up.get("last_error"):
        out.append(f"upstream {one_line(up['last_error'])}")
    return out
