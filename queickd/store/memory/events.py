"""The memory store's crons and event outbox (a mixin of MemoryStore, store/memory/store.py,
which owns the lock, the jobs and `_submit_locked`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ...core.job import NewJob, State, Submitted
from ...core.policy import admission as adm
from ...core.policy import crons, outbox
from ..records import CronFire, CronRecord, Event, EventAccepted, EventState, NewEvent


class MemoryCronsEvents:
    """Crons and outbox events, under the store's one lock."""

    _lock: Any
    _jobs: dict
    _crons: dict[str, CronRecord]
    _events: dict[str, tuple[Event, NewJob]]
    _submit_locked: Callable[..., list]
    _put: Callable[[Any], None]

    # --- cron -----------------------------------------------------------------------------
    def cron_save(self, cron: CronRecord) -> CronRecord:
        with self._lock:
            self._crons[cron.name] = cron
            return cron

    def cron_list(self) -> list[CronRecord]:
        with self._lock:
            return sorted(self._crons.values(), key=lambda c: c.name)

    def cron_delete(self, name: str) -> bool:
        with self._lock:
            return self._crons.pop(name, None) is not None

    def crons_due(self, now: float) -> list[CronRecord]:
        with self._lock:
            return [c for c in self._crons.values() if c.next_run_at <= now]

    def next_cron_at(self) -> float | None:
        with self._lock:
            return min((c.next_run_at for c in self._crons.values()), default=None)

    def cron_move_if(self, name: str, tick: float, new_tick: float) -> bool:
        with self._lock:
            cron = self._crons.get(name)
            if cron is None or cron.next_run_at != tick:
                return False
            self._crons[name] = dataclasses.replace(cron, next_run_at=new_tick)
            return True

    def cron_fire_if_due(self, name: str, tick: float, next_tick: float, now: float) -> CronFire | None:
        with self._lock:
            cron = self._crons.get(name)
            if cron is None or cron.next_run_at != tick:
                return None
            waiting = next((j for j in self._jobs.values() if j.cron == name and j.state in State.PENDING), None)
            if waiting is not None:  # the tick is folded into it: it records the tick
                self._put(dataclasses.replace(waiting, cron_until=tick))
            fire = crons.fire(name, cron.template, tick, now, waiting is not None)
            self._crons[name] = dataclasses.replace(
                cron, next_run_at=next_tick, last_fired_at=tick, folded=cron.folded + int(fire.folded))
            if fire.job is None:
                return CronFire("folded", None)
            answer = self._submit_locked([[fire.job]], now, adm.NO_LIMITS)[0]
            return CronFire("fired", answer[0])  # type: ignore[index]

    # --- events ---------------------------------------------------------------------------
    def _deliver_locked(self, event: Event, job: NewJob, now: float,
                        admission: adm.Admission) -> list[Submitted] | adm.Refusal:
        answer = self._submit_locked([[outbox.job_for(event.event_id, job, now)]], now, admission)[0]
        if not isinstance(answer, adm.Refusal):
            self._events[event.event_id] = (dataclasses.replace(
                event, state=EventState.DELIVERED, job_id=answer[0].job_id, next_attempt_at=None,
                attempts=event.attempts + 1), job)
        return answer

    def accept_event(self, event: NewEvent, now: float, admission: adm.Admission) -> EventAccepted:
        with self._lock:
            old = self._events.get(event.event_id)
            if old is not None:
                return EventAccepted(event.event_id, True, old[0].state, old[0].job_id)
            key = event.job.key
            at = outbox.accepted_at(now, None if key is None else max(
                (e.next_attempt_at for e, _ in self._events.values()  # type: ignore[misc]
                 if e.key == key and e.state == EventState.PENDING), default=None))
            ev = Event(event.event_id, EventState.PENDING, event.job.func, key, now, 0, now if at is None else at,
                       None, None)
            self._events[event.event_id] = (ev, event.job)
            if at is not None:
                return EventAccepted(event.event_id, False, EventState.PENDING, None)
            answer = self._deliver_locked(ev, event.job, now, admission)
        if isinstance(answer, adm.Refusal):
            return EventAccepted(event.event_id, False, EventState.PENDING, None)
        return EventAccepted(event.event_id, False, EventState.DELIVERED, answer[0].job_id)

    def deliver_events(self, now: float, admission: adm.Admission, max_attempts: int,
                       backoff: Callable[[int], float], limit: int = 500) -> list[EventAccepted]:
        out, order = [], outbox.KeyOrder()
        with self._lock:
            # Due first, then in the order accepted (the dict's); sorted() keeps that order.
            due = sorted((e for e, _ in self._events.values()
                          if e.state == EventState.PENDING and e.next_attempt_at is not None and e.next_attempt_at <= now),
                         key=lambda e: e.next_attempt_at)[:limit]  # type: ignore[arg-type, return-value]
            for ev in due:
                if order.holds(ev.key):
                    continue
                job = self._events[ev.event_id][1]
                answer = self._deliver_locked(ev, job, now, admission)
                if not isinstance(answer, adm.Refusal):
                    out.append(EventAccepted(ev.event_id, False, EventState.DELIVERED, answer[0].job_id))
                    continue
                r = outbox.after_refusal(ev.attempts, answer, now, max_attempts, backoff)
                state = EventState.DEAD if r.dead else EventState.PENDING
                self._events[ev.event_id] = (dataclasses.replace(
                    ev, attempts=r.attempts, state=state, next_attempt_at=r.next_attempt_at,
                    last_error=r.last_error), job)
                if order.refused(ev.key, r) is not None:  # the key's later events wait as long
                    self._repair_key_order(ev.key)
                out.append(EventAccepted(ev.event_id, False, state, None))
        return out

    def prune_events(self, created_before: float, limit: int) -> int:
        with self._lock:
            gone = [i for i, (e, _) in self._events.items() if e.state == EventState.DELIVERED
                    and e.created_at < created_before and e.job_id not in self._jobs][:limit]
            for i in gone:
                del self._events[i]
            return len(gone)

    def next_event_at(self) -> float | None:
        with self._lock:
            return min((e.next_attempt_at for e, _ in self._events.values()
                        if e.state == EventState.PENDING and e.next_attempt_at is not None), default=None)

    def oldest_pending_event_at(self) -> float | None:
        """For monitoring: when the oldest pending outbox event was created."""
        with self._lock:
            return min((e.created_at for e, _ in self._events.values() if e.state == EventState.PENDING),
                       default=None)

    def event_counts(self) -> dict[str, int]:
        out = dict.fromkeys(EventState.ALL, 0)
        with self._lock:
            for e, _ in self._events.values():
                out[e.state] += 1
        return out

    def list_events(self, state: str | None, limit: int) -> list[Event]:
        with self._lock:
            events = [e for e, _ in self._events.values() if state is None or e.state == state]
        return sorted(events, key=lambda e: e.created_at, reverse=True)[:limit]

    def retry_event(self, event_id: str, now: float) -> Event | None:
        with self._lock:
            item = self._events.get(event_id)
            if item is None:
                return None
            ev, job = item
            if ev.state == EventState.DEAD:
                self._events[event_id] = (dataclasses.replace(
                    ev, state=EventState.PENDING, attempts=0, next_attempt_at=now), job)
                self._repair_key_order(ev.key)
                ev = self._events[event_id][0]
            return ev

    def _repair_key_order(self, key: str | None = None) -> None:
        """Within each serial key (or only `key`'s), no pending event due before an earlier
        one (sql/schedule.py; the dict keeps the order accepted)."""
        latest: dict[str, float] = {}
        for event_id, (e, job) in list(self._events.items()):
            if e.key is None or e.state != EventState.PENDING or (key is not None and e.key != key):
                continue
            at = max(e.next_attempt_at, latest.get(e.key, e.next_attempt_at))  # type: ignore[type-var]
            latest[e.key] = at
            if at != e.next_attempt_at:
                self._events[event_id] = (dataclasses.replace(e, next_attempt_at=at), job)
