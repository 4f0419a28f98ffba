"""The status page at GET /: one self-contained HTML page (no scripts from elsewhere, no
build step) drawn from the detailed `stats` picture. It refreshes itself every few
seconds. Pure functions: a dict in, a string out.
"""

from __future__ import annotations

import time
from html import escape
from typing import TYPE_CHECKING, Any

from .text import ago, local_time, probe_text, progress_text, stalled_text, unserved

if TYPE_CHECKING:
    from ..api.service import QueueService

REFRESH = 5  # seconds between reloads
_W, _H, _PAD = 640, 170, 30  # chart size in px

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .2em}h2{font-size:1.05em;margin:1.4em 0 .4em}
.sub{color:#666}.grid{display:flex;flex-wrap:wrap;gap:.8em}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.6em .9em;min-width:8em}
.card b{display:block;font-size:1.6em}.bad{color:#b00020}.ok{color:#1b7f3b}
table{border-collapse:collapse;background:#fff}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left}
th{background:#f0f0f0}svg{background:#fff;border:1px solid #ddd;border-radius:6px}
.none{color:#888;font-style:italic}
"""


def snapshot(svc: QueueService) -> dict[str, Any]:
    return svc.op_stats({"detail": True})


def _card(label: str, value: Any, cls: str = "", metric: str = "") -> str:
    attr = f' data-metric="{metric}"' if metric else ""
    return f'<div class="card"><span>{escape(label)}</span><b class="{cls}"{attr}>{escape(str(value))}</b></div>'


def chart(history: list[dict[str, Any]]) -> str:
    """Inline SVG: completed (green) and failed (red) runs per minute as bars, queue depth
    as a blue line, over the last hour."""
    n = max(1, len(history))
    inner_w, inner_h = _W - 2 * _PAD, _H - 2 * _PAD
    step = inner_w / n
    top_rate = max([h["completed"] + h["failed"] for h in history] + [1])
    top_depth = max([h["depth"] or 0 for h in history] + [1])
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
             'role="img" aria-label="queue depth and throughput, last hour">',
             f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _PAD}" y2="{_H - _PAD}" stroke="#999"/>']
    points = []
    for i, h in enumerate(history):
        x = _PAD + i * step
        ok_h = inner_h * h["completed"] / top_rate
        bad_h = inner_h * h["failed"] / top_rate
        y0 = _H - _PAD
        if ok_h:
            parts.append(f'<rect x="{x:.1f}" y="{y0 - ok_h:.1f}" width="{max(1.0, step - 1):.1f}" '
                         f'height="{ok_h:.1f}" fill="#4caf50"><title>{h["completed"]} done</title></rect>')
        if bad_h:
            parts.append(f'<rect x="{x:.1f}" y="{y0 - ok_h - bad_h:.1f}" width="{max(1.0, step - 1):.1f}" '
                         f'height="{bad_h:.1f}" fill="#e53935"><title>{h["failed"]} failed</title></rect>')
        if h["depth"] is not None:
            points.append(f"{x + step / 2:.1f},{y0 - inner_h * h['depth'] / top_depth:.1f}")
    if points:
        parts.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="#1e63c6" stroke-width="2"/>')
    parts += [
        f'<text x="{_PAD}" y="{_H - 8}" font-size="11" fill="#666">-60 min</text>',
        f'<text x="{_W - _PAD}" y="{_H - 8}" font-size="11" fill="#666" text-anchor="end">now</text>',
        f'<text x="{_PAD}" y="18" font-size="11" fill="#1e63c6">waiting (max {top_depth})</text>',
        f'<text x="{_W - _PAD}" y="18" font-size="11" fill="#2e7d32" text-anchor="end">'
        f'runs per minute (max {top_rate}; red: failed)</text>',
        "</svg>",
    ]
    return "".join(parts)


def _table(headers: list[str], rows: list[list[str]], empty: str) -> str:
    if not rows:
        return f'<p class="none">{escape(empty)}</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _sandbox_card(sb: dict[str, Any] | None) -> str:
    if sb is None:
        return ""
    z, kills = sb["zygote"], sum(sb["kills"].values())
    text = (f"{sb['runs']['process']} runs, {kills} limit kills, zygote "
            f"{'alive' if z['alive'] else 'not running'} ({z['restarts']} restarts)")
    lim = sb.get("limits")
    if lim:
        text += f", memory limits by {lim['memory']}" + (f" ({lim['reason']})" if lim["reason"] else "")
    return _card("process jobs", text, "bad" if z["restarts"] else "", metric="sandbox")


def _upstream_card(up: dict[str, Any] | None, now: float) -> str:
    """An edge daemon's forwarding: the link, the held backlog and its oldest, the last forward."""
    if up is None:
        return ""
    last = ago(now, up["last_forward_at"]) + " ago" if up["last_forward_at"] else "never"
    oldest = f", oldest {ago(now, now - up['oldest_held_age'])}" if up["oldest_held_age"] is not None else ""
    text = f"{up['link']}: {up['held']} held{oldest}; last forward {last}"
    return _card("upstream", text, "ok" if up["link"] in ("up", "idle") else "bad", metric="upstream")


def render(s: dict[str, Any]) -> str:
    now = s.get("now") or time.time()
    w, counts, net, sch = s["workers"], s["counts"], s.get("network"), s["scheduler"]
    waiting = counts["scheduled"] + counts["queued"] + counts["waiting_network"]
    dead_total = counts["dead"] + s["events"]["dead"]
    stuck = [name for name, p in s["pools"].items() if unserved(p)]
    if net is None:
        net_text, net_cls = "no checker", ""
    else:
        net_text = f"{net['state']} ({'checker alive' if net['checker_alive'] else 'checker DEAD'})"
        net_cls = "ok" if net["state"] == "up" and net["checker_alive"] else "bad"
    cards = "".join([
        _card("workers busy", f"{w['busy']} / {w['total']}" + (" (draining)" if s.get("draining") else ""),
              "bad" if s.get("draining") else "", metric="workers-busy"),
        _card("idle", w["total"] - w["busy"], metric="workers-idle"),
        _card("pool size", f"{w.get('size', w['total'])} ({w.get('min', w['total'])}-{w.get('max', w['total'])})",
              metric="pool-size"),
        _card("waiting", waiting, metric="waiting"),
        _card("waiting out a retry", s.get("retrying", 0), metric="retrying"),
        _card("scheduled for later", s.get("scheduled_later", 0), metric="scheduled-later"),
        _card("paused", ", ".join(f"{p['kind']} {p['name']}" for p in s["paused"]) or "nothing",
              "bad" if s["paused"] else "", metric="paused"),
        _card("running", counts["running"], metric="running"),
        _card("oldest wait", ago(now, s.get("oldest_queued_at")) if s.get("oldest_queued_at") else "-",
              metric="oldest-wait"),
        _card("dead letters", dead_total, "bad" if dead_total else "", metric="dead"),
        _card("network", net_text, net_cls, metric="network"),
        _card("scheduler", "alive" if sch["alive"] else "STOPPED", "ok" if sch["alive"] else "bad",
              metric="scheduler"),
        _card("pools without workers", len(stuck), "bad" if stuck else "", metric="unserved-pools"),
        _sandbox_card(s.get("sandbox")),
        _upstream_card(s.get("upstream"), now),
    ])
    pools = _table(["pool", "waiting", "live worker slots", "state"],
                   [[name, p["waiting"], p["workers"], "NO LIVE WORKER: its jobs wait" if unserved(p) else ""]
                    for name, p in s["pools"].items()], "no pools")
    fleet = _table(["worker", "kind", "pools", "running", "last beat", "state"],
                   [[f"{wk['host']}:{wk['pid']}", wk["kind"], ", ".join(wk["pools"]),
                     f"{wk['running']} / {wk['slots']}", f"{wk['silent_for']:.0f} s ago",
                     "REFUSED: " + wk["refused"] if wk["refused"] else "alive" if wk["alive"] else "GONE"]
                    for wk in s.get("fleet") or []], "")
    budgets = _table(["budget", "limit", "running", "waiting"],
                     [[f"{b['kind']} {b['name']}", f"{b['limit']:g}", f"{b['running']:g} ({b['running_jobs']} jobs)",
                       f"{b['waiting']:g} ({b['waiting_jobs']} jobs)"] for b in s.get("budgets") or []], "")
    rates = _table(["rate key", "limit", "in the window", "next start", "blocked until"],
                   [[k["key"], f"{k['limit']} per {k['per']:g} s", k["used"],
                     "now" if k["next_start"] <= now else "in " + ago(k["next_start"], now),
                     local_time(k["blocked_until"]) if k.get("blocked_until") else ""]
                    for k in s.get("rate_keys") or []], "")
    fair = _table(["fair key", "pool", "waiting", "last start"],
                  [[k["key"], k["pool"], k["waiting"], ago(now, k["last_start"]) + " ago" if k["last_start"] else "not yet"]
                   for k in s.get("fair_keys") or []], "")
    blocks = s.get("key_blocks") or {}
    keys = _table(["key", "waiting", "oldest due", "held"],
                  [[k["key"], k["waiting"], ago(now, k["oldest_run_at"]) + " ago"
                    if k["oldest_run_at"] <= now else "in " + ago(k["oldest_run_at"], now),
                    blocks.get(k["key"], "")]
                   for k in s["waiting_by_key"]], "no jobs waiting on a key")
    paused = _table(["kind", "name", "since", "failures", "last error", "next probe"],
                    [[p["kind"], p["name"], local_time(p["paused_at"]), p["failures"],
                      f"{p['last_error'].get('type')}: {p['last_error'].get('message')}" if p.get("last_error")
                      else "- (paused by hand)",
                      probe_text(p, now).strip(" ()")]
                     for p in s["paused"]], "nothing paused")
    running = _table(["job", "function", "key", "running for", "progress"],
                     [[j["id"], j["func"], j["key"] or "", ago(now, j["started_at"]),
                       " · ".join(t for t in (stalled_text(j), progress_text(j.get("progress"), 80)) if t)]
                      for j in s.get("running", [])],
                     "nothing running")
    dead = _table(["job", "function", "died", "error"],
                  [[j["id"], j["func"], local_time(j["finished_at"]),
                    f"{j['error']['type']}: {j['error']['message']}"] for j in s.get("dead_jobs", [])]
                  + [[f"event {e['event_id']}", e["func"], local_time(e["created_at"]), e["last_error"] or ""]
                     for e in s.get("dead_events", [])], "no dead letters")
    wf = s.get("workflows") or {"runs": {}, "budget_stops": {}}
    runs = _table(["workflow runs", *wf["runs"]], [[""] + [str(v) for v in wf["runs"].values()]], "")
    stops = _table(["budget", "runs stopped"], [[k, v] for k, v in sorted(wf["budget_stops"].items())],
                   "no run stopped by a budget")
    state_line = " · ".join(f"{k} {v}" for k, v in counts.items())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{REFRESH}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>queickd status</title><style>{_CSS}</style></head>
<body>
<h1>queickd {escape(s['version'])}</h1>
<p class="sub">store {escape(s['store'])} · up {ago(now, now - s['uptime'])}
 · {escape(local_time(now))} · refreshes every {REFRESH} s</p>
<div class="grid">{cards}</div>
<h2>Last hour</h2>
{chart(s.get("history", []))}
<p class="sub">jobs: {escape(state_line)} · enqueued {s['enqueued']} · completed {s['completed']}
 · failed runs {s['failed']} · refused {s['refused']} · outbox pending {s['events']['pending']}</p>
<h2>Pools</h2>{pools}{fleet if s.get("fleet") else ""}
{"<h2>Budgets</h2>" + budgets if s.get("budgets") else ""}
{"<h2>Rate limits</h2>" + rates if s.get("rate_keys") else ""}
{"<h2>Fair shares</h2>" + fair if s.get("fair_keys") else ""}
<h2>Waiting per key</h2>{keys}
<h2>Paused</h2>{paused}
<h2>Running</h2>{running}
<h2>Dead letters</h2>{dead}
<h2>Workflows</h2>{runs}{stops}
</body></html>
"""
