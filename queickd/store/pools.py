"""Moving waiting work between worker pools: the one SQL behind every SQL store's set_pool."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .sqlstates import WAITING_IN

KINDS = ("job", "key", "cron")
_WAITING = f"state IN {WAITING_IN}"


def set_pool_sql(execute: Callable[..., Any], kind: str, name: str, pool: str, mark: str) -> int:
    """Run the UPDATEs of set_pool with `execute(sql, params)` inside the caller's
    transaction (`mark`: the driver's parameter marker). Returns jobs and crons moved."""
    if kind == "job":
        return execute(f"UPDATE jobs SET pool = {mark} WHERE id = {mark} AND {_WAITING}", (pool, int(name))).rowcount
    if kind == "key":
        return execute(f"UPDATE jobs SET pool = {mark} WHERE key = {mark} AND {_WAITING}", (pool, name)).rowcount
    if kind == "cron":
        n = execute(f"UPDATE jobs SET pool = {mark} WHERE cron = {mark} AND {_WAITING}", (pool, name)).rowcount
        row = execute(f"SELECT template FROM crons WHERE name = {mark}", (name,)).fetchone()
        if row is not None:
            template = json.loads(row[0])
            template["pool"] = pool
            execute(f"UPDATE crons SET template = {mark} WHERE name = {mark}",
                    (json.dumps(template, separators=(",", ":"), ensure_ascii=False), name))
            n += 1
        return n
    raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
