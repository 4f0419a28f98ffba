"""Fair shares of the TCP server's connections before authentication (api/server.py).

A connection is *unproven* from its accept until it authenticates (hello with the token)
or, without a token, sends its first request. Unproven connections are counted by source
(an IPv4 address, or an IPv6 /64: one host's usual allocation) and together hold at most
the connections less a PROVEN_RESERVE_SHARE kept for proven ones. When that pool or the
server is full, a newcomer whose source holds less than its share (PER_SOURCE_SHARE) and
less than the largest holder less one takes the place of that holder's oldest unproven
connection; any other is refused. So hosts that never authenticate cannot keep another
out, and while there is room a burst of one client's connections is served whole.
Loop thread only; no I/O (the eviction is the connection's own `evict`).
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from typing import Protocol

PER_SOURCE_SHARE = 8  # one source: at most 1/8 of the connections unproven (32 of 256)
PROVEN_RESERVE_SHARE = 4  # 1/4 of the connections (64 of 256) never held by unproven ones


class Unproven(Protocol):
    def evict(self, message: str) -> None: ...


def source_of(address: tuple) -> str:
    """The source a peer address counts under: the IPv4 address, or the IPv6 /64."""
    try:
        ip = ipaddress.ip_address(address[0].split("%", 1)[0])
    except (ValueError, IndexError, AttributeError):
        return str(address)
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class PreauthLimits:
    """Who holds the unproven connections. `admit` at accept, `release` when a connection
    proves itself, closes, or fails to be set up."""

    def __init__(self, max_connections: int) -> None:
        self.max_connections = max_connections
        self.per_source = max(1, max_connections // PER_SOURCE_SHARE)
        self.pool = max(1, max_connections - max_connections // PROVEN_RESERVE_SHARE)
        self.count: Counter[str] = Counter()  # unproven, set up or being set up, per source
        self.total = 0
        self._open: dict[str, dict[Unproven, None]] = {}  # per source, oldest first

    def admit(self, source: str, conn: Unproven, connections: int) -> str | None:
        """Count `conn`, just accepted from `source`, with `connections` open or being set up
        → None, or the reason it is refused (the module's rules)."""
        held = self.count[source]
        server_full = connections >= self.max_connections
        if server_full or self.total >= self.pool:
            victim = self._largest_holders_oldest(held) if held < self.per_source else None
            if victim is None:
                if held >= self.per_source:
                    return (f"too many unauthenticated connections from {source} ({held}, "
                            f"{self.per_source} when the server is busy); authenticate on one or close one first")
                if server_full:
                    return f"too many connections ({self.max_connections}); try again later"
                return f"too many unauthenticated connections ({self.pool}); try again later"
            victim_source, conn = victim
            self.release(victim_source, conn)
            conn.evict("closed: too many unauthenticated connections from your address while another "
                       "host waited; authenticate sooner or open fewer")
        self.count[source] += 1
        self.total += 1
        self._open.setdefault(source, {})[conn] = None
        return None

    def _largest_holders_oldest(self, held: int) -> tuple[str, Unproven] | None:
        src = max(self._open, key=self.count.__getitem__, default=None)  # the first of the largest
        if src is None or self.count[src] <= held + 1:  # swapping would not make the shares fairer
            return None
        return src, next(iter(self._open[src]))

    def release(self, source: str, conn: Unproven) -> None:
        """`conn` no longer counts as unproven (idempotent)."""
        conns = self._open.get(source)
        if conns is None or conns.pop(conn, False) is False:
            return
        if not conns:
            del self._open[source]
        self.count[source] -= 1
        if self.count[source] <= 0:
            del self.count[source]
        self.total -= 1
