"""Claim selection: which queued jobs may start now, shared by every store.

The store reads the candidates (queued jobs in queue order: priority, run_at, then
insertion) and the running picture (serial keys with a running job, pauses), and offers
the candidates one by one to a `Selection`; the selection says which may start, up to the
limit, and the store marks those running. Pure: no I/O of its own, no clock.

A candidate may start when it is eligible (its pool is served, its network, if it needs
one, is up, its pool is not paused, neither its function nor its key is paused, unless that pause's probe is due:
see below) and every rule admits it. Rules
are small classes with the same three methods (`Rule`), applied in order; the first:
- `SerialKeys`: a serial key runs at most one job at a time, and only its head (its
  first job in queue order) may start, so a key's jobs run in enqueue order: a head that
  cannot start, for any reason, still holds its key.
More rules (concurrency groups, cost budgets) join the tuple in `Selection.__init__`; a
rule decides for itself whether a job it passes over holds anything (a key's head does;
a job over a budget need not, so cheaper jobs behind it may start).

A pause whose probe is due (its cooldown over, no probe of it running: `Running.probes`)
lets exactly one job through: the first candidate that is eligible and admitted takes the
probe of each pause it is under (`Selection.probes`), and the store stamps those pauses
with the job's id in the claim's transaction, so no second probe starts. (PostgreSQL's
SQL claim takes probes after the claim's other jobs, when room is left: see pgschema.py.)

A store may leave out, before offering, candidates that every rule would pass over
without holding anything (a job of another pool that has no key), and may stop reading
once the selection is `full`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol


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


class Row(NamedTuple):
    """A candidate as the SQL stores read it: the columns selection needs, no more (a
    tuple: it is made for every row a claim reads)."""

    id: int
    key: str | None
    func: str
    pool: str
    retry_on_network: bool


# Request and Running are made on every claim: plain slotted classes, cheaper to build
# than frozen ones; nothing changes them after.
@dataclass(slots=True)
class Running:
    """What is running or held now, as the store read it in the claim's transaction."""

    keys: frozenset[str] = frozenset()  # serial keys with a running job
    paused_keys: frozenset[str] = frozenset()
    paused_funcs: frozenset[str] = frozenset()
    paused_pools: frozenset[str] = frozenset()  # paused by hand: no probe
    probes: frozenset[tuple[str, str]] = frozenset()  # (kind, name) of pauses whose probe is due

    @staticmethod
    def of(running_keys: Iterable[str | None], pauses: Iterable[tuple[str, str]] = (),
           probes: Iterable[tuple[str, str]] = ()) -> Running:
        """From the keys of running jobs, the (kind, name) of pauses and of those pauses
        whose probe is due."""
        keys = frozenset(running_keys)
        held = list(pauses)
        if not held:  # the common case, on every claim: no pause to sort
            return Running(keys - {None} if None in keys else keys)  # type: ignore[arg-type]
        return Running(keys - {None},  # type: ignore[arg-type]
                       frozenset(n for kind, n in held if kind == "key"),
                       frozenset(n for kind, n in held if kind == "func"),
                       frozenset(n for kind, n in held if kind == "pool"),
                       frozenset(probes))


@dataclass(slots=True)
class Request:
    """What the claimer asks for: how many jobs, of which pools, with the network up or not."""

    limit: int
    network_up: bool = True
    pools: frozenset[str] | None = None  # None: every pool

    @staticmethod
    def of(limit: int, network_up: bool = True, pools: Sequence[str] | None = None) -> Request:
        return Request(limit, network_up, None if pools is None else frozenset(pools))


class Rule(Protocol):
    """A rule about what runs together (serial keys; next, concurrency groups, budgets)."""

    def admits(self, c: Candidate) -> bool:
        """May this candidate start, as far as this rule knows?"""
    def started(self, c: Candidate) -> None:
        """The candidate starts: count what it takes."""
    def passed(self, c: Candidate) -> None:
        """The candidate was passed over (by this or another rule)."""


class SerialKeys:
    """A key runs one job at a time, its jobs in queue order."""

    __slots__ = ("busy",)

    def __init__(self, running: frozenset[str]) -> None:
        self.busy = set(running)  # keys running, or held by a head seen earlier

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

    __slots__ = ("limit", "chosen", "rules", "probes", "_net", "_pools", "_paused_funcs", "_paused_keys",
                 "_paused_pools", "_open")

    def __init__(self, request: Request, running: Running) -> None:
        self.limit = request.limit
        self.chosen: list[int] = []
        self.rules: tuple[Rule, ...] = (SerialKeys(running.keys),)
        self.probes: list[tuple[tuple[str, str], int]] = []  # (pause, job id): probes let through
        self._net, self._pools = request.network_up, request.pools
        self._paused_funcs, self._paused_keys = running.paused_funcs, running.paused_keys
        self._paused_pools = running.paused_pools
        self._open = set(running.probes)  # due probes not taken yet by this selection

    @property
    def full(self) -> bool:
        return len(self.chosen) >= self.limit

    def eligible(self, c: Candidate) -> bool:
        """Its pool is served, its network (if it needs one) is up, its function and key
        are not paused (or their pause's probe is due). Nothing is counted: the rules do that."""
        return ((self._net or not c.retry_on_network)
                and (self._pools is None or c.pool in self._pools)
                and (not self._paused_pools or c.pool not in self._paused_pools)
                and (c.func not in self._paused_funcs or ("func", c.func) in self._open)
                and (c.key is None or c.key not in self._paused_keys or ("key", c.key) in self._open))

    def _take_probes(self, c: Candidate) -> None:
        """c starts: it is the probe of each pause it is under."""
        for t in (("func", c.func), ("key", c.key)):
            if t in self._open:
                self._open.discard(t)
                self.probes.append((t, c.id))  # type: ignore[arg-type]

    def offer(self, c: Candidate) -> bool:
        if len(self.chosen) >= self.limit:
            return False
        rules = self.rules
        if self.eligible(c):
            for rule in rules:
                if not rule.admits(c):
                    break
            else:
                for rule in rules:
                    rule.started(c)
                self.chosen.append(c.id)
                if self._open:
                    self._take_probes(c)
                return True
        for rule in rules:
            rule.passed(c)
        return False


    def offer_all(self, candidates: Iterable[Candidate]) -> None:
        """offer() each in turn until full: the same decisions, one call per page of rows
        (a claim may read hundreds of rows to start a few jobs)."""
        chosen, limit, rules, eligible = self.chosen, self.limit, self.rules, self.eligible
        for c in candidates:
            if len(chosen) >= limit:
                return
            if eligible(c):
                for rule in rules:
                    if not rule.admits(c):
                        break
                else:
                    for rule in rules:
                        rule.started(c)
                    chosen.append(c.id)
                    if self._open:
                        self._take_probes(c)
                    continue
            for rule in rules:
                rule.passed(c)


def select(candidates: Iterable[Candidate], request: Request, running: Running) -> list[int]:
    """The ids that may start, in queue order, at most request.limit of them."""
    s = Selection(request, running)
    s.offer_all(candidates)
    return s.chosen
