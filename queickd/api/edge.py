"""What the front door of an edge daemon (one with an `[upstream]`) does for it: routes the
jobs of the upstream's functions to be held and forwarded (services/forwarder/), refuses
them with queue_full once the held backlog is at its cap, and shows a forwarded job as
its upstream copy is."""

from __future__ import annotations

import dataclasses

from ..core.job import NewJob
from ..core.policy import forward as policy
from ..services.forwarder.forwarder import Forwarder
from ..services.forwarder.view import ForwardedView


class Edge:
    def __init__(self, forwarder: Forwarder) -> None:
        self.forwarder = forwarder
        self.view = ForwardedView(forwarder)

    def route(self, jobs: list[NewJob]) -> list[NewJob]:
        """The jobs, those for the upstream marked held; QueueError(queue_full) if they would
        pass the backlog's cap (the request is refused whole, as any enqueue's)."""
        route = self.forwarder.route
        if not any(route(j.func) for j in jobs):
            return jobs
        out = [dataclasses.replace(j, held=True) if route(j.func) else j for j in jobs]
        held = [j for j in out if j.held]
        self.forwarder.backlog.admit(len(held), sum(policy.size(j) for j in held))
        return out

    def committed(self, jobs: list[NewJob], fresh: list[bool]) -> None:
        """After a commit: the held jobs newly stored (not a duplicate's answer) wake the forwarder."""
        held = [j for j, new in zip(jobs, fresh, strict=True) if new and j.held]
        if held:
            self.forwarder.offer(len(held), sum(policy.size(j) for j in held))
