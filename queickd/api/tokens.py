"""The named tokens in force on the TCP port (queickd/tokenfile.py: the file) and what each
name did: connections, jobs enqueued, when last seen (`queick status`).

identify() and the counters run on the server's loop thread; reload() on the main thread
(SIGHUP), which swaps the whole table at once; snapshot() on the I/O threads. Never logs
or returns a token.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import tokenfile

log = logging.getLogger("queickd.server")


class Tokens:
    def __init__(self, path: str, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        self._by_token = tokenfile.read(path)  # {token: name}
        self._lock = threading.Lock()  # the counters: written on the loop, read by status
        self._seen: dict[str, list[Any]] = {}  # name -> [connections, enqueued, last seen]

    def identify(self, given: object) -> str | None:
        """The name whose token `given` is, or None. Every token is compared, in constant
        time each: how long it takes does not tell which one matched, or how nearly."""
        if not isinstance(given, str):
            return None
        found = None
        for token, name in self._by_token.items():
            if hmac.compare_digest(given.encode(), token.encode()):
                found = name
        return found

    def reload(self) -> set[str]:
        """Read the file again; the names whose token is gone or changed (revoked), whose
        connections the server closes. A file that cannot be read or parsed leaves the
        tokens in force as they were, and raises ValueError."""
        new = tokenfile.read(self.path)
        old, self._by_token = self._by_token, new
        revoked = {name for token, name in old.items() if new.get(token) != name}
        log.info("token file %s reloaded: %d token(s)%s", self.path, len(set(new.values())),
                 f"; revoked: {', '.join(sorted(revoked))}" if revoked else "")
        return revoked

    def connected(self, name: str) -> None:
        with self._lock:
            seen = self._seen.setdefault(name, [0, 0, 0.0])
            seen[0] += 1
            seen[2] = self.clock()

    def enqueued(self, name: str, source: str, funcs: list[str], answers: list[Any]) -> None:
        """Count and log what `name` enqueued from `source`: one line per commit of its
        connection's requests (`answers`: the store's per request, a list of Submitted or
        a refusal), with the jobs' ids and functions."""
        ids = [s.job_id for a in answers if isinstance(a, list) for s in a if not s.duplicate]
        with self._lock:
            seen = self._seen.setdefault(name, [0, 0, 0.0])
            seen[1] += len(ids)
            seen[2] = self.clock()
        if ids:
            shown = ", ".join(map(str, ids[:5])) + (f", ... ({len(ids)} in all)" if len(ids) > 5 else "")
            kinds = sorted(set(funcs))
            log.info("token %s from %s enqueued job(s) %s: %s", name, source, shown,
                     ", ".join(kinds[:3]) + (", ..." if len(kinds) > 3 else ""))

    def snapshot(self) -> list[dict[str, Any]]:
        """Each name in force or seen since the start: its connections and jobs enqueued
        since, when last seen, and whether its token is still in force."""
        with self._lock:
            seen = {k: list(v) for k, v in self._seen.items()}
        names = list(dict.fromkeys(self._by_token.values())) + sorted(set(seen) - set(self._by_token.values()))
        return [{"name": n, "connections": seen.get(n, [0])[0], "enqueued": seen.get(n, [0, 0])[1],
                 "last_seen": seen[n][2] if n in seen else None, "revoked": n not in self._by_token.values()}
                for n in names]
