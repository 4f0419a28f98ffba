"""Moving waiting work between worker pools: the one SQL behind every SQL store's set_pool."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .sqlstates import WAITING_IN

_COLUMNS = {"job": "id", "key": "key", "cron": "cron"}  # the jobs column each kind names
_WAITING = f"state IN {WAITING_IN}"


def set_pool_sql(execute: Callable[..., Any], kind: str, name: str, pool: str, mark: str) -> int:
    """Run the UPDATEs of set_pool with `execute(sql, params)` inside the caller's
    transaction (`mark`: the driver's parameter marker). Returns jobs and crons moved."""
    column = _COLUMNS.get(kind)
    if column is None:
        raise ValueError(f"kind must be one of {', '.join(_COLUMNS)}, not {kind!r}")
    n = execute(f"UPDATE jobs SET pool = {mark} WHERE {column} = {mark} AND {_WAITING}",
                (pool, int(name) if kind == "job" else name)).rowcount
    if kind == "cron":
        row = execute(f"SELECT template FROM crons WHERE name = {mark}", (name,)).fetchone()
        if row is not None:
            template = json.loads(row[0])
            template["pool"] = pool
            execute(f"UPDATE crons SET template = {mark} WHERE name = {mark}",
                    (json.dumps(template, separators=(",", ":"), ensure_ascii=False), name))
            n += 1
    return n
