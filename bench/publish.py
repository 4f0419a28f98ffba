"""The user-facing performance tables: Markdown built from the JSON that `python -m bench.run
--json` (SQLite) and `python -m bench.pg --json` (PostgreSQL) write, put into a docs page
between marker comments.

    python -m bench.publish --json RESULTS.json [--pg-json PG.json] [--page PATH]
    python -m bench.publish --json RESULTS.json --markdown      # print the tables only

Each table sits between `<!-- bench:sqlite:start -->` and `<!-- bench:sqlite:end -->`
(`bench:pg:...` for PostgreSQL) and opens with the machine the run named (CPU, cores,
memory, kernel, Python, date). Every number and ratio is a median of the JSON's rounds;
a row whose measurement the run lacks is left out. Text outside the markers is never
changed, and a page without a table's markers is refused, not rewritten.

It reads files and writes the page only: it starts no process and measures nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.manyclients import RATE as MANY
from bench.peers import HUEY, QUEICK, QUEICKD_MEMORY, QUEICKD_NORMAL
from bench.peers import QUEICKD_SQLITE as QUEICKD
from bench.running import E2E_MANY
from bench.running import E2E_SINGLE as E2E

DEFAULT_PAGE = Path(__file__).resolve().parent.parent / "docs" / "explanation" / "performance.md"


class PageError(Exception):
    """The page cannot take the tables (missing or unpaired markers)."""


class Run:
    """One bench JSON file: its medians by (scenario, target, metric), machine and settings."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.machine: dict[str, Any] = doc.get("machine", {})
        self.settings: dict[str, Any] = doc.get("settings", {})
        self.scenarios: list[dict[str, Any]] = doc.get("scenarios", [])
        self.results = {(r["scenario"], r["target"], r["metric"]): r for r in doc.get("results", [])
                        if r.get("median") is not None}

    @classmethod
    def load(cls, path: Path) -> Run:
        return cls(json.loads(Path(path).read_text()))

    def median(self, scenario: str, target: str, metric: str) -> float | None:
        r = self.results.get((scenario, target, metric))
        return r["median"] if r else None


def number(v: float, whole: bool = False) -> str:
    """1,852 / 37.4 / 1.1: whole numbers from 100 up (and counts), one decimal below."""
    return f"{v:,.0f}" if whole or abs(v) >= 100 else f"{v:,.1f}"


def machine_line(run: Run, store: str) -> str:
    m, st = run.machine, run.settings
    date = m.get("date") or "an unrecorded date"
    rounds = st.get("rounds")
    how = f"median of {rounds} round{'s' if rounds != 1 else ''}" if rounds else "medians"
    extra = f", SQLite {m['sqlite']}" if m.get("sqlite") and store == "sqlite" else ""
    extra += f", PostgreSQL {m['postgres']}" if m.get("postgres") else ""
    load = m.get("loadavg_start")
    extra += f"; load average {load[0]:.1f} at the start" if load else ""  # a shared machine says so
    return (f"Measured on {date} on {m.get('cpu', 'an unnamed CPU')}, {m.get('nproc', '?')} cores, "
            f"{m.get('mem_total', '?')} RAM, Linux {m.get('kernel', '?')}, Python {m.get('python', '?')}{extra}"
            f" ({how}{', quick mode' if st.get('quick') else ''}).")


# --- SQLite: chosen rows, one column per system -------------------------------------------------
@dataclass
class Row:
    """A table row: its label, the measurements its cells show (scenario, metric, joined by
    " / " when there are several), their unit, and whether the ratio to the peers is shown."""

    label: str
    cells: list[tuple[str, str]]
    unit: str
    ratio: bool = True
    queickd: str = QUEICKD  # the target the queickd column shows
    whole: bool = False  # counts: no decimals


def _sqlite_rows(st: dict[str, Any]) -> list[Row]:
    e2e, clients, client_jobs = st.get("e2e_jobs"), st.get("clients"), st.get("client_jobs")
    fsync = f"+{st['slow_fsync_ms']:g} ms" if st.get("slow_fsync_ms") is not None else "slowed"
    n = f"{e2e:,} jobs" if e2e else "jobs"
    many = f"{clients} client processes × {client_jobs:,} jobs" if clients and client_jobs else "many client processes"
    return [
        Row(f"end to end, {n} appending a byte, one enqueue per job, 4 workers", [("e2e", E2E)], "jobs/s"),
        Row("daemon + client CPU per job, the same", [("e2e", "CPU per job (server+client)")], "µs"),
        Row("bytes written per job (daemon + client), the same", [("e2e", "written per job (server+client)")],
            "bytes"),
        Row(f"{many}, one request at a time, 4 workers", [("many-clients", MANY)], "jobs/s"),
        Row("the same, enqueue only (nothing runs the jobs)", [("many-clients-enqueue", MANY)], "jobs/s"),
        Row("one client, one request at a time, enqueue only", [("enqueue-single", "enqueue rate")], "jobs/s"),
        Row("… the same, `--durability normal`", [("enqueue-single", "enqueue rate")], "jobs/s", False,
            QUEICKD_NORMAL),
        Row("… the same, memory store", [("enqueue-single", "enqueue rate")], "jobs/s", False, QUEICKD_MEMORY),
        Row("enqueue → start, lone jobs 50 ms apart, p50 / p90 / p99",
            [("latency", f"enqueue→start {p}") for p in ("p50", "p90", "p99")], "ms"),
        Row("batched: pipelined on one connection / `enqueue_many` (one request per chunk)",
            [("enqueue-pipelined", "enqueue rate"), ("enqueue-many", "enqueue rate")], "jobs/s", False),
        Row(f"batched: end to end from `enqueue_many`, {n}, 4 workers", [("e2e-many", E2E_MANY)], "jobs/s", False),
        Row(f"SD card (every fsync {fsync}): many clients, enqueue only", [("sd-many-clients", MANY)], "jobs/s"),
        Row("SD card: end to end, one enqueue per job, 4 workers", [("sd-e2e", E2E)], "jobs/s"),
        Row("SD card: end to end from `enqueue_many` (batched)", [("sd-e2e-many", E2E_MANY)], "jobs/s", False),
        Row("kill -9 under load: acknowledged but never ran / ran twice",
            [("crash", "acknowledged, never ran"), ("crash", "ran more than once")], "jobs", False, whole=True),
        Row("idle: CPU per minute", [("idle", "CPU")], "ms", False),
        Row("idle: context switches per minute", [("idle", "context switches")], "", False, whole=True),
        Row("daemon RSS with 100,000 queued jobs", [("memory-100k", "RSS after")], "MiB"),
        Row("store size per queued job, after a clean stop", [("memory-100k", "store per job, after clean stop")],
            "bytes"),
    ]


def _cell(run: Run, row: Row, target: str) -> tuple[str, list[float] | None]:
    values = [run.median(scenario, target, metric) for scenario, metric in row.cells]
    if any(v is None for v in values):
        return ("—", None) if all(v is None for v in values) else (" / ".join(
            "—" if v is None else number(v, row.whole) for v in values) + (f" {row.unit}" if row.unit else ""), None)
    vs = [v for v in values if v is not None]
    return " / ".join(number(v, row.whole) for v in vs) + (f" {row.unit}" if row.unit else ""), vs


def _ratio(mine: list[float], theirs: list[float] | None, name: str) -> str | None:
    if theirs is None or len(theirs) != len(mine) or not all(theirs):
        return None
    return " / ".join(f"{a / b:.2f}×" for a, b in zip(mine, theirs, strict=True)) + f" {name}"


def sqlite_table(run: Run) -> str:
    head = ["| SQLite, one machine | queickd SQLite/full | Queick 1.2.1 | huey 3.5.4 |", "|---|---|---|---|"]
    lines = []
    for row in _sqlite_rows(run.settings):
        mine, mine_v = _cell(run, row, row.queickd)
        if mine_v is None and mine == "—":
            continue  # not measured in this run
        peers = [_cell(run, row, t) if row.queickd == QUEICKD else ("", None) for t in (QUEICK, HUEY)]
        if row.ratio and mine_v is not None:
            ratios = [r for r in (_ratio(mine_v, peers[0][1], "Queick"), _ratio(mine_v, peers[1][1], "huey")) if r]
            if ratios:
                mine += f" ({'; '.join(ratios)})"
        lines.append(f"| {row.label} | {mine} | {peers[0][0]} | {peers[1][0]} |")
    if not lines:
        return ""
    ratio_note = ("Ratios in brackets are queickd's median over the peer's: above 1 for a rate means "
                  "queickd is faster, below 1 for a cost means it uses less. — : not measured in this run.")
    return "\n".join([machine_line(run, "sqlite"), "", *head, *lines, "", ratio_note])


# --- PostgreSQL: every measurement of the run, one column per target ------------------------------
def pg_table(run: Run) -> str:
    targets: list[str] = []
    for sc in run.scenarios:
        targets += [t for t in sc["targets"] if t not in targets]
    if not targets or not run.results:
        return ""
    lines = ["| PostgreSQL | " + " | ".join(targets) + " |", "|---" * (len(targets) + 1) + "|"]
    for sc in run.scenarios:
        metrics: list[str] = []
        for scenario, _, metric in run.results:
            if scenario == sc["name"] and metric not in metrics:
                metrics.append(metric)
        for metric in metrics:
            units = {run.results[k]["unit"] for k in run.results if k[0] == sc["name"] and k[2] == metric}
            unit = next(iter(units)) if len(units) == 1 else ""
            cells = []
            for t in targets:
                v = run.median(sc["name"], t, metric)
                cells.append("—" if v is None else number(v) + (f" {unit}" if unit else ""))
            lines.append(f"| {sc.get('title', sc['name'])}: {metric} | " + " | ".join(cells) + " |")
    return "\n".join([machine_line(run, "pg"), "", *lines])


# --- the page ------------------------------------------------------------------------------------
def replace_between(page: str, name: str, body: str) -> str:
    """page with the text between `<!-- bench:NAME:start -->` and its end marker replaced by
    body; PageError when the markers are missing, repeated or out of order."""
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    if page.count(start) != 1 or page.count(end) != 1 or page.index(start) > page.index(end):
        raise PageError(f"the page needs exactly one {start} followed by one {end}")
    before, rest = page.split(start)
    _, after = rest.split(end)
    return f"{before}{start}\n{body.strip()}\n{end}{after}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.publish", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, help="bench.run's JSON (the SQLite table)")
    p.add_argument("--pg-json", type=Path, help="bench.pg's JSON (the PostgreSQL table)")
    p.add_argument("--page", type=Path, default=DEFAULT_PAGE, help="the page to write (default: %(default)s)")
    p.add_argument("--markdown", action="store_true", help="print the tables instead of writing the page")
    a = p.parse_args(argv)
    if a.json is None and a.pg_json is None:
        p.error("give --json, --pg-json or both")
    tables: dict[str, str] = {}
    try:
        if a.json:
            tables["sqlite"] = sqlite_table(Run.load(a.json))
        if a.pg_json:
            tables["pg"] = pg_table(Run.load(a.pg_json))
    except (OSError, ValueError, KeyError) as e:
        print(f"bench.publish: cannot read the results: {e}", file=sys.stderr)
        return 2
    empty = [k for k, v in tables.items() if not v]
    if empty:
        print(f"bench.publish: no measurements for the {', '.join(empty)} table in the JSON", file=sys.stderr)
        return 2
    if a.markdown:
        print("\n\n".join(tables.values()))
        return 0
    page = a.page.read_text()
    try:
        for name, body in tables.items():
            page = replace_between(page, name, body)
    except PageError as e:
        print(f"bench.publish: {a.page}: {e}", file=sys.stderr)
        return 2
    a.page.write_text(page)
    print(f"wrote the {' and '.join(tables)} table(s) into {a.page}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
