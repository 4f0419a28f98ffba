"""A forwarded job as the edge shows it (`get`, `wait`, `queick show`): its state is its
upstream copy's, read there at each look; once final there, it is settled here (stored
with the upstream's result or error) and later looks need no upstream."""

from __future__ import annotations

import threading
from typing import Any

from ...core.job import Job, State
from ...core.protocol import Code, QueueError
from .forwarder import Forwarder
from .link import IDLE, UP, Link, LinkError

LOOK_TIMEOUT = 5.0  # seconds a look upstream may take before the edge answers alone


class ForwardedView:
    def __init__(self, forwarder: Forwarder) -> None:
        self.forwarder = forwarder
        self.link = Link(forwarder.settings, timeout=min(LOOK_TIMEOUT, forwarder.settings.timeout))
        self._lock = threading.Lock()  # one look at a time on the view's own connection

    def show(self, job: Job) -> dict[str, Any]:
        """The wire form of a `forwarded` job: the upstream's state, result and error, and
        `upstream` {id, state, link}; its own when the upstream cannot say."""
        f = self.forwarder
        local = job.to_dict()
        local["upstream"] = {"id": job.upstream_id, "state": None, "link": f.state}
        if f.state not in (UP, IDLE):  # known unreachable: no wait on a dead link per look
            return local
        try:
            with self._lock:
                up = self.link.get(job.upstream_id)
        except QueueError as e:
            if e.code != Code.NOT_FOUND:
                raise
            up = None
        except LinkError as e:
            local["upstream"]["error"] = str(e)
            return local
        if up is None or up["state"] in State.FINAL:
            f.settle_one(job.id, {"ok": True, "job": up} if up is not None else
                         {"ok": False, "error": {"code": Code.NOT_FOUND, "message": "no such job"}})
            f.on_settled([job.id])
            settled = f.store.get(job.id)
            out = (settled or job).to_dict()
            out["upstream"] = {"id": job.upstream_id, "state": None if up is None else up["state"], "link": f.state}
            return out
        for name in ("state", "attempts", "started_at", "progress", "error"):
            local[name] = up.get(name)
        local["upstream"]["state"] = up["state"]
        return local

    def close(self) -> None:
        self.link.close()
