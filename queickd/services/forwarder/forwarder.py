"""The forwarder: a thread that sends the held jobs to the upstream in batches, oldest
first, each with its forward key (policy/forward.py), and records what the upstream said.

It sleeps until a commit of held jobs wakes it (offer), a reconnect is due (back-off
doubling to `retry_max`), or, with forwarded jobs not yet final, the next read of their
state upstream (`settle_every`). With nothing held or forwarded it does not wake at all.
A batch whose replies did not all come is sent again, with the same keys, at the next
connection: the upstream answers a job it has already with the id it gave it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ...core.job import State
from ...core.policy import forward as policy
from ...core.protocol import QueueError
from ...store import Store
from .backlog import Backlog
from .link import DOWN, IDLE, UNAUTHORIZED, UP, Link, LinkError
from .settings import UpstreamSettings

log = logging.getLogger("queickd.forwarder")

SETTLE_BATCH = 500  # forwarded jobs whose upstream state one settle round reads


class Forwarder:
    def __init__(self, store: Store, settings: UpstreamSettings, *, clock: Callable[[], float] = time.time,
                 on_settled: Callable[[list[int]], None] = lambda ids: None) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.on_settled = on_settled  # local ids whose state changed: their waiters look again
        self.backlog = Backlog(*store.held_backlog(), settings.max_backlog_jobs, settings.max_backlog_bytes)
        self.link = Link(settings)
        self.state = IDLE  # the link's, as the last attempt found it (link.py)
        self.last_error: str | None = None
        self.last_forward_at: float | None = None
        self.forwarded = 0  # jobs the upstream took, since start
        self.refused = 0  # jobs it refused for good (dead here)
        self.wakeups = 0  # times the thread woke: the idle cost, for the bench and /metrics
        self.next_attempt_at: float | None = None
        self._backoff = policy.Backoff(most=settings.retry_max)
        self._pacing = policy.Pacing(settings.bytes_per_second)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._settle_at: float | None = None

    # --- other threads ----------------------------------------------------------------------
    def route(self, func: str) -> bool:
        return self.settings.route.upstream(func)

    def offer(self, jobs: int, size: int) -> None:
        """Held jobs were committed (the batcher's thread): count them, wake the thread."""
        self.backlog.added(jobs, size, self.clock())
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="queickd-forwarder", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(self.settings.timeout + 5)
        self.link.close()

    def snapshot(self) -> dict[str, Any]:
        """The forwarding's state for `queick status`, the status page and /metrics."""
        now, b = self.clock(), self.backlog
        return {"url": self.settings.url, "identity": self.settings.identity, "link": self.state,
                "held": b.jobs, "held_bytes": b.bytes, "max_held": b.max_jobs, "max_held_bytes": b.max_bytes,
                "oldest_held_age": None if b.oldest is None else round(max(0.0, now - b.oldest), 3),
                "last_forward_at": self.last_forward_at, "forwarded": self.forwarded, "refused": self.refused,
                "last_error": self.last_error, "next_attempt_at": self.next_attempt_at, "wakeups": self.wakeups}

    # --- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                delay = self._round()
            except Exception as e:  # a store error: said, and tried again a while later
                log.exception("forwarding failed; trying again in %.0f s", self.settings.retry_max)
                self.last_error, delay = f"{type(e).__name__}: {e}", self.settings.retry_max
            self._wake.wait(delay)
            self._wake.clear()
            self.wakeups += 1

    def _round(self) -> float | None:
        """Forward what is held, then settle what is due; the seconds until the next round
        (None: until woken)."""
        now = self.clock()
        if self.next_attempt_at is not None and now < self.next_attempt_at:
            return self.next_attempt_at - now
        self.next_attempt_at = None
        try:
            self._forward_held()
            if self._settle_at is None or now >= self._settle_at:
                self._settle()
        except LinkError as e:
            return self._failed(e)
        if self._settle_at is None:
            return None
        return max(0.0, self._settle_at - self.clock())

    def _failed(self, e: LinkError) -> float:
        delay = self._backoff.failed() if e.state == DOWN else self.settings.retry_max
        changed = (self.state, self.last_error) != (e.state, str(e))
        self.state, self.last_error = e.state, str(e)
        self.next_attempt_at = self.clock() + delay
        if e.state != DOWN:  # the operator must act: said at every attempt
            log.error("forwarding to %s stopped, %d job(s) held: %s", self.settings.url, self.backlog.jobs, e)
        elif changed:
            log.warning("upstream %s unreachable (%s); %d job(s) held, next attempt in %.0f s",
                        self.settings.url, e, self.backlog.jobs, delay)
        return delay

    def _up(self) -> None:
        if self.state != UP:
            log.info("upstream %s reachable; forwarding %d held job(s)", self.settings.url, self.backlog.jobs)
        self.state, self.last_error = UP, None
        self._backoff.succeeded()

    def _forward_held(self) -> None:
        s, sent = self.settings, 0
        while not self._stop.is_set():
            held = self.store.held_jobs(s.batch_jobs + 1)
            if not held:
                self.backlog.removed(self.backlog.jobs, self.backlog.bytes, None)  # the store's truth
                if sent:
                    log.info("forwarded %d job(s) to %s; none held", sent, s.url)
                return
            sizes = [policy.size(j) for j in held]
            n = policy.cut(sizes, s.batch_jobs, max(1, s.bytes_per_second or 1 << 62))
            pause = self._pacing.take(sum(sizes[:n]), self.clock())
            if pause > 0 and self._stop.wait(pause):
                return
            batch, now = held[:n], self.clock()
            replies = self.link.enqueue_each([policy.request(j, s.identity, now) for j in batch])
            self._up()
            self._record(batch, sizes[:n], replies, held[n].created_at if len(held) > n else None)
            sent += n

    def _record(self, batch: list[Any], sizes: list[int], replies: list[dict[str, Any]],
                next_oldest: float | None) -> None:
        accepted, gone, gone_bytes, stop, later = [], 0, 0, None, None
        now = self.clock()
        for job, size, reply in zip(batch, sizes, replies, strict=True):
            meaning = policy.meaning(reply)
            if meaning == policy.ACCEPTED:
                accepted.append((job.id, reply["job_id"]))
            elif meaning == policy.REFUSED:
                err = reply["error"]
                log.warning("upstream refused job %d (%s): %s; it is dead here", job.id, err.get("code"),
                            err.get("message"))
                if self.store.refuse_held(job.id, {"type": err.get("code"), "message": err.get("message"),
                                                   "upstream": self.settings.url}, now):
                    self.refused += 1
                    self.on_settled([job.id])
            elif meaning == policy.STOP:
                stop = stop or reply["error"]
                continue
            else:
                later = later or reply["error"]
                continue
            gone, gone_bytes = gone + 1, gone_bytes + size
        if accepted:
            if self.store.mark_forwarded(accepted) < len(accepted):
                self._cancel_upstream(accepted)
            self.forwarded += len(accepted)
            self.last_forward_at = now
            if self._settle_at is None:
                self._settle_at = now + self.settings.settle_every
        self.backlog.removed(gone, gone_bytes, next_oldest if not (stop or later) else self.backlog.oldest)
        if stop is not None:
            raise LinkError(UNAUTHORIZED, f"the upstream refuses our token: {stop.get('message')}")
        if later is not None:
            raise LinkError(DOWN, f"the upstream cannot take jobs now ({later.get('code')}: {later.get('message')})")

    def _cancel_upstream(self, accepted: list[tuple[int, int]]) -> None:
        """Jobs cancelled here while their batch was on its way (no longer held when it was
        marked): cancelled upstream too, so that a job cancelled on the edge does not run."""
        for local, upstream in accepted:
            job = self.store.get(local)
            if job is None or job.state != State.CANCELLED:
                continue
            try:
                self.link.cancel(upstream)
                log.info("job %d was cancelled while it was forwarded; cancelled upstream as job %d", local, upstream)
            except (QueueError, LinkError) as e:  # final there already, or the link went: said, not retried
                log.warning("job %d was cancelled while it was forwarded; upstream job %d could not be "
                            "cancelled: %s", local, upstream, e)

    def _settle(self) -> None:
        """Read the upstream state of forwarded jobs; those final there become so here."""
        after, settled, pending = 0, [], False
        while not self._stop.is_set():
            pairs = self.store.forwarded_jobs(SETTLE_BATCH, after)
            if not pairs:
                break
            replies = self.link.get_many([u for _, u in pairs])
            for (local, _), reply in zip(pairs, replies, strict=True):
                if self.settle_one(local, reply):
                    settled.append(local)
                else:
                    pending = True
            after = pairs[-1][0]
        if settled:
            self.on_settled(settled)
        self._settle_at = self.clock() + self.settings.settle_every if pending else None

    def settle_one(self, local: int, reply: dict[str, Any]) -> bool:
        """Settle one forwarded job from the upstream's `get` reply; True if it is final now."""
        if not reply.get("ok"):  # the upstream no longer has it (its retention): say so, once
            err = reply.get("error") or {}
            return self.store.settle_forwarded(local, State.DEAD, None, {
                "type": "upstream_lost", "message": f"the upstream answers {err.get('code')}: {err.get('message')}"},
                self.clock())
        job = reply["job"]
        if job["state"] not in State.FINAL:
            return False
        return self.store.settle_forwarded(local, job["state"], job.get("result"), job.get("error"),
                                           job.get("finished_at"))
