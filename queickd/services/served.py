"""Which worker pools a live worker serves, as last seen: what tells an enqueue for a pool
nobody serves that its job will wait (it is accepted: a worker may come later).

Read on the enqueue path (a set lookup: no store access, safe from any thread); written
once by a daemon that is its store's only worker, or after each heartbeat from a shared
store's worker registry (services/fleet.py), so a worker that joined or left is seen
within a heartbeat. Never refuses anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

EVERY = "*"  # a worker registered for every pool


def warning(pool: str) -> str:
    """What an enqueue reply says of a job for `pool` when no live worker serves it."""
    return (f"no live worker serves pool {pool!r}: the job waits until one does "
            f"(a daemon or 'queick worker' started with --pool {pool})")


class ServedPools:
    def __init__(self, pools: Iterable[str] | None = None) -> None:
        """`pools`: those served, or None while unknown (nothing is then said)."""
        self._pools: frozenset[str] | None = None if pools is None else frozenset(pools)

    def set(self, pools: Iterable[str]) -> bool:
        """Whether that changed what is served."""
        new, old = frozenset(pools), self._pools
        self._pools = new  # replaced whole: a reader sees the old set or the new
        return new != old

    def from_registry(self, registry: list[dict[str, Any]]) -> bool:
        """The pools of the registry's live workers that have a slot to run a job; whether
        that changed what is served."""
        return self.set(p for w in registry if w["alive"] and w["slots"] > 0 for p in w["pools"])

    @property
    def pools(self) -> list[str]:
        return sorted(self._pools or ())

    def serves(self, pool: str) -> bool:
        """False only when `pool` is known to have no live worker."""
        known = self._pools
        return known is None or pool in known or EVERY in known

    def unserved(self, pools: Iterable[str]) -> list[str]:
        """Those of `pools` no live worker serves, in order, each once."""
        known = self._pools
        if known is None or EVERY in known:
            return []
        return list(dict.fromkeys(p for p in pools if p not in known))
