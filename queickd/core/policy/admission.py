"""Admission: which submitted jobs go in, shared by every store and run inside its transaction.

A request (one `enqueue`, or a whole `enqueue_many`) is admitted all or nothing:
- a job whose idempotency key matches a live job (younger than the TTL) is a duplicate and
  answers with that job's id;
- a manual job for a key that already has a job waiting or running is refused `conflict`,
  naming that job;
- a request that would push a key past max_queued_per_key waiting jobs, or the queue past
  max_queued, is refused `queue_full`.
The store supplies what it knows through `Lookups` (read inside its transaction); this
module decides, and the store writes what was admitted. Pure: no I/O of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..job import NewJob, Submitted, insert_state
from .forward import is_forward_key

RETRY_AFTER_DEFAULT = 1.0  # seconds a refused sender is told to wait before trying again


@dataclass(frozen=True, slots=True)
class Admission:
    """Limits applied to submitted jobs. None means no limit."""

    max_queued: int | None = None
    max_queued_per_key: int | None = None
    idempotency_ttl: float | None = None


NO_LIMITS = Admission()


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request was not admitted. code is a protocol code (queue_full, conflict)."""

    code: str
    message: str
    job_id: int | None = None  # the job a conflict is with
    retry_after: float | None = None


@dataclass(frozen=True, slots=True)
class Existing:
    job_id: int
    state: str
    created_at: float


@dataclass
class Lookups:
    """What admission needs to read; each callable runs inside the store's transaction."""

    by_idempotency_key: Callable[[str], Existing | None]
    waiting_for_key: Callable[[str], int]  # scheduled + queued + waiting_network of a key
    waiting_total: Callable[[], int]
    active_for_key: Callable[[str], int | None]  # a job of the key waiting or running


@dataclass
class Plan:
    """The decision for a batch of requests: per request, its answers or its refusal; plus
    the jobs to insert (in order) and the expired idempotency keys to release first."""

    answers: list[list[Submitted | None] | Refusal]
    inserts: list[tuple[int, int, NewJob]]  # (request index, job index, job)
    expired_keys: list[str]
    repeats: list[tuple[int, int, str]]  # (request, job, key): a key admitted earlier in the batch


def plan(requests: Sequence[Sequence[NewJob]], now: float, limits: Admission, look: Lookups) -> Plan:
    answers: list[list[Submitted | None] | Refusal] = []
    inserts: list[tuple[int, int, NewJob]] = []
    expired: list[str] = []
    # Admitted earlier in this same transaction:
    new_keys: dict[str, tuple[int, int]] = {}  # idempotency key -> (request, job) position
    added_per_key: dict[str, int] = {}
    added_total = 0
    waiting_cache: dict[str, int] = {}
    total: int | None = None
    active_new: set[str] = set()  # keys given a job by this batch
    repeats: list[tuple[int, int, str]] = []

    for r, jobs in enumerate(requests):
        if len(jobs) == 1 and jobs[0].key is None and jobs[0].idempotency_key is None:
            # The common request, one plain job: only the overall cap applies.
            if limits.max_queued is not None:
                if total is None:
                    total = look.waiting_total()
                if total + added_total + 1 > limits.max_queued:
                    answers.append(Refusal("queue_full", f"the queue holds {limits.max_queued} waiting "
                                           "jobs, its limit", retry_after=RETRY_AFTER_DEFAULT))
                    continue
            added_total += 1
            inserts.append((r, 0, jobs[0]))
            answers.append([None])
            continue
        out: list[Submitted | None] = [None] * len(jobs)
        mine: list[tuple[int, NewJob]] = []
        mine_keys: dict[str, int] = {}
        per_key: dict[str, int] = {}
        refusal: Refusal | None = None
        for i, j in enumerate(jobs):
            if j.idempotency_key is None and j.key is None:  # the common job: nothing to check
                mine.append((i, j))
                continue
            ik = j.idempotency_key
            if ik is not None:
                if ik in mine_keys or ik in new_keys:
                    repeats.append((r, i, ik))  # answered after insertion, from the first one's id
                    continue
                old = look.by_idempotency_key(ik)
                if old is not None:
                    # A forwarded job's key lasts as long as its job (policy/forward.py).
                    if (limits.idempotency_ttl is None or now - old.created_at < limits.idempotency_ttl
                            or is_forward_key(ik)):
                        out[i] = Submitted(old.job_id, old.state, duplicate=True)
                        continue
                    expired.append(ik)
                mine_keys[ik] = i
            if j.manual and j.key is not None:
                if j.key in active_new or j.key in per_key:
                    refusal = Refusal("conflict", f"key {j.key!r} already has a job in this batch")
                    break
                other = look.active_for_key(j.key)
                if other is not None:
                    refusal = Refusal("conflict", f"key {j.key!r} already has job {other} waiting or "
                                      "running", job_id=other)
                    break
            if j.key is not None:
                per_key[j.key] = per_key.get(j.key, 0) + 1
            mine.append((i, j))
        if refusal is None and limits.max_queued_per_key is not None:
            for key, n in per_key.items():
                if key not in waiting_cache:
                    waiting_cache[key] = look.waiting_for_key(key)
                if waiting_cache[key] + added_per_key.get(key, 0) + n > limits.max_queued_per_key:
                    refusal = Refusal("queue_full", f"key {key!r} has {limits.max_queued_per_key} jobs "
                                      "waiting, its limit", retry_after=RETRY_AFTER_DEFAULT)
                    break
        if refusal is None and limits.max_queued is not None and mine:
            if total is None:
                total = look.waiting_total()
            if total + added_total + len(mine) > limits.max_queued:
                refusal = Refusal("queue_full", f"the queue holds {limits.max_queued} waiting jobs, "
                                  "its limit", retry_after=RETRY_AFTER_DEFAULT)
        if refusal is not None:
            repeats = [x for x in repeats if x[0] != r]
            answers.append(refusal)
            expired = [k for k in expired if k not in mine_keys]
            continue
        for key, n in per_key.items():
            added_per_key[key] = added_per_key.get(key, 0) + n
            active_new.add(key)
        added_total += len(mine)
        for ik, i in mine_keys.items():
            new_keys[ik] = (r, i)
        inserts.extend((r, i, j) for i, j in mine)
        answers.append(out)
    return Plan(answers, inserts, expired, repeats)


def finish(p: Plan, requests: Sequence[Sequence[NewJob]], ids: Sequence[int], now: float) -> list[list[Submitted] | Refusal]:
    """Fill in the answers once the store has inserted p.inserts with these ids."""
    first: dict[str, Submitted] = {}
    answers = p.answers
    for (r, i, j), job_id in zip(p.inserts, ids, strict=True):
        sub = Submitted(job_id, insert_state(j.held, j.run_at, now))
        answers[r][i] = sub  # type: ignore[index]
        if j.idempotency_key is not None:
            first[j.idempotency_key] = sub
    for r, i, key in p.repeats:
        f = first[key]
        answers[r][i] = Submitted(f.job_id, f.state, duplicate=True)  # type: ignore[index]
    return answers  # type: ignore[return-value]
