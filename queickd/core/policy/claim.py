"""Claim selection: which queued jobs may start now, shared by every store.

The store reads the candidates (queued jobs in queue order: priority, run_at, then
insertion) and the running picture (serial keys with a running job, pauses), and offers
the candidates one by one to a `Selection`; the selection says which may start, up to the
limit, and the store marks those running. Pure: no I/O of its own, no clock.

Rules, each a small class with the same three methods, applied in order:
- `Eligible`: the job's pool is served, its network (if it needs one) is up, and neither
  its function nor its key is paused;
- `SerialKeys`: a serial key runs at most one job at a time, and only its head (its
  first job in queue order) may start, so a key's jobs run in enqueue order: a head that
  cannot start, for any rule, still holds its key.
More rules (concurrency groups, cost budgets) join the list in `Selection.__init__`; a
rule decides for itself whether a job it passes over holds anything (a key's head does;
a job over a budget need not, so cheaper jobs behind it may start).

A store may leave out, before offering, candidates that every rule would pass over
without holding anything (a job of another pool that has no key), and may stop reading
once the selection is `full`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol


class Candidate(Protocol):
    """What selection reads of a queued job (a `Job` is one; SQL stores read a `Row`)."""

    @property
    def id(self) -> int: ...
    @property
    def key(self) -> str | None: ...
    @property
    def func(self) -> str: ...
    @property
    def pool(self) -> str: ...
    @property
    def retry_on_network(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Row:
    """A candidate as the SQL stores read it: the columns selection needs, no more."""

    id: int
    key: str | None
    func: str
    pool: str
    retry_on_network: bool


@dataclass(frozen=True, slots=True)
class Running:
    """What is running or held now, as the store read it in the claim's transaction."""

    keys: frozenset[str] = frozenset()  # serial keys with a running job
    paused_keys: frozenset[str] = frozenset()
    paused_funcs: frozenset[str] = frozenset()

    @staticmethod
    def of(running_keys: Iterable[str | None], pauses: Iterable[tuple[str, str]] = ()) -> Running:
        """From the keys of running jobs and the (kind, name) of pauses."""
        held = list(pauses)
        return Running(frozenset(k for k in running_keys if k is not None),
                       frozenset(n for kind, n in held if kind == "key"),
                       frozenset(n for kind, n in held if kind == "func"))


@dataclass(frozen=True, slots=True)
class Request:
    """What the claimer asks for: how many jobs, of which pools, with the network up or not."""

    limit: int
    network_up: bool = True
    pools: frozenset[str] | None = None  # None: every pool

    @staticmethod
    def of(limit: int, network_up: bool = True, pools: Sequence[str] | None = None) -> Request:
        return Request(limit, network_up, None if pools is None else frozenset(pools))


class Rule(Protocol):
    def admits(self, c: Candidate) -> bool:
        """May this candidate start, as far as this rule knows?"""
    def started(self, c: Candidate) -> None:
        """The candidate starts: count what it takes."""
    def passed(self, c: Candidate) -> None:
        """The candidate was passed over (by this or another rule)."""


@dataclass(slots=True)
class Eligible:
    request: Request
    running: Running

    def admits(self, c: Candidate) -> bool:
        r, run = self.request, self.running
        return ((r.network_up or not c.retry_on_network)
                and (r.pools is None or c.pool in r.pools)
                and c.func not in run.paused_funcs
                and (c.key is None or c.key not in run.paused_keys))

    def started(self, c: Candidate) -> None:
        pass

    def passed(self, c: Candidate) -> None:
        pass


@dataclass(slots=True)
class SerialKeys:
    busy: set[str] = field(default_factory=set)  # keys running, or held by a head seen earlier

    def admits(self, c: Candidate) -> bool:
        return c.key is None or c.key not in self.busy

    def started(self, c: Candidate) -> None:
        if c.key is not None:
            self.busy.add(c.key)

    def passed(self, c: Candidate) -> None:
        if c.key is not None:
            self.busy.add(c.key)  # a waiting head holds its key: order within a key


class Selection:
    """Offer candidates in queue order; `offer` says whether each may start."""

    __slots__ = ("limit", "rules", "chosen")

    def __init__(self, request: Request, running: Running) -> None:
        self.limit = request.limit
        self.rules: tuple[Rule, ...] = (Eligible(request, running), SerialKeys(set(running.keys)))
        self.chosen: list[int] = []

    @property
    def full(self) -> bool:
        return len(self.chosen) >= self.limit

    def offer(self, c: Candidate) -> bool:
        if self.full:
            return False
        if all(rule.admits(c) for rule in self.rules):
            for rule in self.rules:
                rule.started(c)
            self.chosen.append(c.id)
            return True
        for rule in self.rules:
            rule.passed(c)
        return False


def select(candidates: Iterable[Candidate], request: Request, running: Running) -> list[int]:
    """The ids that may start, in queue order, at most request.limit of them."""
    s = Selection(request, running)
    for c in candidates:
        if s.full:
            break
        s.offer(c)
    return s.chosen
