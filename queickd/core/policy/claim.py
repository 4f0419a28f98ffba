"""Claim selection: which queued jobs may start now, shared by every store.

The store reads the candidates (queued jobs in queue order: priority, run_at, then
insertion) and the running picture (serial keys with a running job, pauses), and offers
the candidates one by one to a `Selection`; the selection says which may start, up to the
limit, and the store marks those running. Pure: no I/O of its own, no clock.

A candidate may start when it is eligible (`Selection.eligible`) and every rule admits
it. Rules are small classes with the same three methods (`Rule`), applied in order:
- `SerialKeys`: a serial key runs at most one job at a time, and only its head (its
  first job in queue order) may start, so a key's jobs run in enqueue order: a head that
  cannot start, for any reason, still holds its key.
- `ConcurrencyGroups`: at most `concurrency_limit` jobs of a `concurrency_group` run at
  once (the lowest limit among the job's and its group's running jobs'); skip, not block.
- `RateLimits` (rates.py): at most `limit` starts of a rate key per `per` seconds.
- `CostBudgets` (costs.py): the cost units of a pool and of a group within their budgets.
A rule decides for itself whether a job it passes over holds anything.

What runs is read from the running jobs themselves (`Running.of`: their keys, groups,
pools and costs, a handful of rows read through the running index), never from counters
that a crash could leave wrong: a job recovered as an orphan is no longer running, so its
slot and its cost are free again with nothing else to release.

A pause whose probe is due (its cooldown over, no probe of it running: `Running.probes`)
lets exactly one job through: the first candidate that is eligible and admitted takes the
probe of each pause it is under (`Selection.probes`), and the store stamps those pauses
with the job's id in the claim's transaction, so no second probe starts. (PostgreSQL's
SQL claim takes probes after the claim's other jobs, when room is left: see store/postgres/schema.py.)

A store may leave out, before offering, candidates that every rule would pass over
without holding anything (a job of another pool that has no key) and those
`Selection.left_out` names, and may stop reading once the selection is `done`: however
many wait, the jobs behind them are reached, on every store alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

# Limits and NO_LIMITS are imported from here by the stores and services.
from .costs import BUDGET_EPS, NO_LIMITS, CostBudgets, Limits, used_up
from .rates import RateLimits, Windows


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
    @property
    def run_at(self) -> float: ...
    @property
    def concurrency_group(self) -> str | None: ...
    @property
    def concurrency_limit(self) -> int | None: ...
    @property
    def cost_units(self) -> float | None: ...
    @property
    def rate_limit(self) -> Any: ...  # rates.parse reads it: None, a dict, or its JSON text


class Row(NamedTuple):
    """A candidate as the SQL stores read it: the columns selection needs, no more (a
    tuple: it is made for every row a claim reads)."""

    id: int
    key: str | None
    func: str
    pool: str
    retry_on_network: bool
    run_at: float = 0.0
    concurrency_group: str | None = None
    concurrency_limit: int | None = None
    cost_units: float | None = None
    rate_limit: str | None = None


ROW_COLS = ("id, key, func, pool, retry_on_network, run_at, concurrency_group, concurrency_limit, cost_units,"
            " rate_limit")
# What the stores read of each running job for Running.of: (key, group, slot, pool, cost).
RUNNING_COLS = "key, concurrency_group, {slot}, concurrency_limit, pool, cost_units"


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
    slots: dict[str, set[int]] = dataclasses.field(default_factory=dict)  # group -> slots taken
    pool_cost: dict[str, float] = dataclasses.field(default_factory=dict)  # running cost per pool
    group_cost: dict[str, float] = dataclasses.field(default_factory=dict)  # and per group
    group_limit: dict[str, int] = dataclasses.field(default_factory=dict)  # as its running jobs say
    rates: Windows | None = None  # rate key -> its window (rates.py); None: none logged

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

    @staticmethod
    def of_jobs(running: Iterable[tuple[str | None, str | None, int | None, int | None, str, float | None]],
                pauses: Iterable[tuple[str, str]] = (), probes: Iterable[tuple[str, str]] = ()) -> Running:
        """From (key, group, slot, limit, pool, cost) of each running job (RUNNING_COLS) and the
        pauses. A store that keeps no slot numbers gives None: slots are then counted."""
        rows = running if isinstance(running, list) else list(running)
        r = Running.of([row[0] for row in rows], pauses, probes)
        pool_cost, slots, group_cost, group_limit = r.pool_cost, r.slots, r.group_cost, r.group_limit
        for _, group, slot, limit, pool, units in rows:
            c = 1.0 if units is None else units
            pool_cost[pool] = pool_cost.get(pool, 0.0) + c
            if group is not None:
                taken = slots.get(group)
                if taken is None:
                    taken = slots[group] = set()
                taken.add(slot if slot is not None else -len(taken) - 1)  # unnumbered: distinct
                group_cost[group] = group_cost.get(group, 0.0) + c
                group_limit[group] = min(group_limit.get(group, 1 << 30), limit or 1)
        return r


@dataclass(slots=True)
class Request:
    """What the claimer asks for: how many jobs, of which pools, with the network up or not."""

    limit: int
    network_up: bool = True
    pools: frozenset[str] | None = None  # None: every pool
    limits: Limits = NO_LIMITS
    now: float = 0.0  # for the budgets' patience
    exclude: frozenset[int] = frozenset()  # ids set aside by the claimer: not started, keys held

    @staticmethod
    def of(limit: int, network_up: bool = True, pools: Sequence[str] | None = None,
           limits: Limits = NO_LIMITS, now: float = 0.0, exclude: Collection[int] = ()) -> Request:
        return Request(limit, network_up, None if pools is None else frozenset(pools), limits, now,
                       frozenset(exclude))


class Rule(Protocol):
    """A rule about what runs together (serial keys; next, concurrency groups, rate limits,
    budgets)."""

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


class ConcurrencyGroups:
    """At most a group's limit of its jobs run at once; a job over it is skipped, not
    blocking. Each job started takes the lowest free slot number of its group (the
    PostgreSQL store keeps it under a unique index, so two hosts cannot both take it)."""

    __slots__ = ("taken", "slot_of", "limit_of")

    def __init__(self, slots: dict[str, set[int]], limits: dict[str, int]) -> None:
        self.taken = {g: set(s) for g, s in slots.items()}
        self.limit_of = dict(limits)  # the limit the group's running jobs carry
        self.slot_of: dict[int, int] = {}  # job id -> its slot, for jobs started here

    def admits(self, c: Candidate) -> bool:
        g = c.concurrency_group
        if g is None:
            return True
        taken = self.taken.get(g)
        # Below its own limit and every running job's: the same on every store, whatever
        # limits the group's jobs carry.
        return taken is None or len(taken) < min(c.concurrency_limit or 1, self.limit_of.get(g, 1 << 30))

    def started(self, c: Candidate) -> None:
        g = c.concurrency_group
        if g is None:
            return
        taken = self.taken.setdefault(g, set())
        slot = next(i for i in range(1, len(taken) + 2) if i not in taken)
        taken.add(slot)
        self.slot_of[c.id] = slot
        self.limit_of[g] = min(self.limit_of.get(g, 1 << 30), c.concurrency_limit or 1)  # it runs now

    def passed(self, c: Candidate) -> None:
        pass  # skip, not block: the next job of the group, or of another, may start


class Selection:
    """Offer candidates in queue order; `offer` says whether each may start."""

    __slots__ = ("limit", "chosen", "rules", "groups", "rates", "look_ahead", "read", "out_groups", "out_pools",
                 "probes", "_net", "_pools", "_paused_funcs", "_paused_keys", "_paused_pools", "_open", "_exclude")

    def __init__(self, request: Request, running: Running) -> None:
        self.limit = request.limit
        self.chosen: list[int] = []
        self.groups = ConcurrencyGroups(running.slots, running.group_limit)
        rules: list[Rule] = [SerialKeys(running.keys), self.groups]
        self.rates = RateLimits({} if running.rates is None else running.rates, request.now)
        rules.append(self.rates)
        # Candidates counted (`read`) before the claim stops. Unbounded without budgets, as
        # before them: what is passed over then is held keys, and what is left out.
        self.look_ahead, self.read = 1 << 62, 0
        # What is left out (see left_out): decided from what runs, before any is read.
        lim = self.groups.limit_of
        self.out_groups = frozenset(g for g, t in self.groups.taken.items() if len(t) >= lim.get(g, 1 << 30))
        self.out_pools: frozenset[str] = frozenset()
        limits = request.limits
        if limits.any:
            rules.append(CostBudgets(limits, running.pool_cost, running.group_cost, request.now))
            self.look_ahead = LOOK_AHEAD + request.limit
            if running.pool_cost:
                self.out_pools = used_up(running.pool_cost, limits.pools)
                self.out_groups |= used_up(running.group_cost, limits.groups)
        self.rules: tuple[Rule, ...] = tuple(rules)
        self.probes: list[tuple[tuple[str, str], int]] = []  # (pause, job id): probes let through
        self._net, self._pools = request.network_up, request.pools
        self._paused_funcs, self._paused_keys = running.paused_funcs, running.paused_keys
        self._paused_pools = running.paused_pools
        self._open = set(running.probes)  # due probes not taken yet by this selection
        self._exclude = request.exclude

    @property
    def full(self) -> bool:
        return len(self.chosen) >= self.limit

    @property
    def done(self) -> bool:
        """Nothing more is taken: the claim has its jobs, or has read its look-ahead."""
        return len(self.chosen) >= self.limit or self.read >= self.look_ahead

    def left_out(self, c: Candidate) -> bool:
        """Is c of a group full by what runs, or of a pool or group whose budget what runs
        has used up? Such a job is passed over holding only its key (its head's), and is
        not counted against the look-ahead: a store may leave these out of what it reads
        (`out_groups`, `out_pools`) if it starts no keyed job that is not its key's head."""
        return c.concurrency_group in self.out_groups or c.pool in self.out_pools

    def slot(self, job_id: int) -> int | None:
        """The group slot a chosen job takes (None: it has no group)."""
        return self.groups.slot_of.get(job_id)

    def eligible(self, c: Candidate) -> bool:
        """Its pool is served and not paused, its network (if it needs one) is up, its
        function and key are not paused (or their pause's probe is due), the claimer has not
        set it aside (`Request.exclude`: jobs its memory gate sent back, which keep their
        place and their key). Nothing is counted: the rules do that."""
        return ((self._net or not c.retry_on_network)
                and (not self._exclude or c.id not in self._exclude)
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
        """Whether c may start (it is then chosen and counted by every rule)."""
        n = len(self.chosen)
        self.offer_all((c,))
        return len(self.chosen) > n

    def offer_all(self, candidates: Iterable[Candidate]) -> None:
        """offer() each in turn until done: the same decisions, one call per page of rows
        (a claim may read hundreds of rows to start a few jobs)."""
        chosen, limit, rules, eligible = self.chosen, self.limit, self.rules, self.eligible
        keys, ahead, read = rules[0], self.look_ahead, self.read
        out_groups, out_pools = self.out_groups, self.out_pools
        out = bool(out_groups or out_pools)
        for c in candidates:
            if len(chosen) >= limit or read >= ahead:
                break
            if out and (c.concurrency_group in out_groups or c.pool in out_pools):
                keys.passed(c)  # left out (see left_out): it holds its key, no more
                continue
            read += 1
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
        self.read = read


class Totals(NamedTuple):
    """What runs, in total: bounds of what `Running` holds, read without a row per running
    job. Every group has at most `jobs` running and none is full while `jobs` is below
    `least_limit`; every pool and group runs at most `units` cost units."""

    jobs: int  # jobs running
    least_limit: int | None  # the lowest limit (`concurrency_limit or 1`) of a running grouped job; None: none runs
    units: float | None  # the cost units of every running job, added up (each at least 0); None: not read


_EPS = 2.220446049250313e-16  # sys.float_info.epsilon


def plain(heads: Sequence[Candidate], request: Request, paused: bool,
          running: Running | Totals | None = None, rated: bool = False) -> list[int] | None:
    """The selection's choice without the selection, for the common claim. `heads`: the
    first request.limit queued jobs in queue order of the pools served (fewer if no more
    wait), `paused`: whether any pause exists, `running`: what runs, or bounds of it (None:
    not read). With nothing paused and no key or unmet need of the network among the heads,
    and each head within its group's limit and its budgets, counting what runs and the
    heads before it, every rule admits each of them and nothing else is read before them:
    the selection takes exactly these. None when a rule may pass one over: then select().
    A head with a group, or any head while a budget is in force, needs `running`: without
    it, None. With `Totals`, None also when the bounds leave it open (then what runs).

    A head of a group that what runs fills (by the lowest limit of its running jobs), or of
    a pool or group whose budget what runs has used up, is passed over by the selection:
    None, and the store then leaves such jobs out of what it reads (Selection.left_out).
    A head with a rate limit: None, unless `rated` (the store found that the rate rule
    admits every head: rates.admit_all)."""
    if paused:
        return None
    net, pools, exclude = request.network_up, request.pools, request.exclude
    grouped = False
    for c in heads:
        if (c.key is not None or (c.rate_limit is not None and not rated) or (c.retry_on_network and not net)
                or (pools is not None and c.pool not in pools) or (exclude and c.id in exclude)):
            return None
        if c.concurrency_group is not None:
            grouped = True
    if not grouped and not request.limits.any:
        return [c.id for c in heads]
    if running is None:
        return None
    if type(running) is Totals:
        return _within_totals(heads, request.limits, running)
    return _within(heads, request.limits, running)


def _within_totals(heads: Sequence[Candidate], limits: Limits, totals: Totals) -> list[int] | None:
    """plain() for heads that may start as far as keys, pauses, pools and the network go,
    from the bounds of what runs: their ids if each head would fit its group were every
    running job and every grouped head before it in that group, and its budgets were every
    running job's units and every head's before it in them; else None (what runs may still
    let them: the store reads it)."""
    ran, least, units = totals
    if units is None and limits.any:
        return None
    # A bound below every limit of its group: the least of what runs, then of the grouped
    # heads before it too (they would be running). Some group may be full by what runs
    # (see plain) when `ran` reaches it.
    cap = 1 << 30 if least is None else least
    # Within each budget less the rounding that adding up the same units another way may
    # differ by, so that CostBudgets's own sums fit too.
    slack = (ran + len(heads) + 2) * 4 * _EPS
    pools, groups = limits.pools, limits.groups
    for c in heads:
        g = c.concurrency_group
        if g is not None:
            own_limit = c.concurrency_limit or 1
            if ran >= own_limit or ran >= cap:
                return None
            cap = min(cap, own_limit)
            ran += 1  # a bound of what its group runs for the heads after it
        if pools or groups:
            own = 1.0 if c.cost_units is None else c.cost_units
            for budget in (pools.get(c.pool), None if g is None else groups.get(g)):
                # Over it, or it may be used up (the selection leaves its jobs out).
                if budget is not None and (units + own > budget - slack * abs(budget)  # type: ignore[operator]
                                           or units >= budget - BUDGET_EPS):  # type: ignore[operator]
                    return None
            units += own if own > 0 else 0.0  # type: ignore[operator]  # a bound for the heads after it
    return [c.id for c in heads]


def _within(heads: Sequence[Candidate], limits: Limits, running: Running) -> list[int] | None:
    """plain() for heads that may start as far as keys, pauses, pools and the network go,
    from what runs: their ids if each is within its group and its budgets, else None."""
    slots, running_limit = running.slots, running.group_limit
    pool_budget, group_budget = limits.pools, limits.groups
    started: dict[str, int] = {}  # group -> heads before this one that start
    caps: dict[str, int] = {}  # group -> the least limit of its running jobs and of those heads
    used: dict[tuple[bool, str], float] = {}  # (a group's?, name) -> units running and of those heads
    for c in heads:
        g = c.concurrency_group
        if g is not None:
            cap = caps.get(g)
            if cap is None:
                cap = running_limit.get(g, 1 << 30)
            own_limit = c.concurrency_limit or 1
            # A group full by what runs (see plain), or by its own limit: as ConcurrencyGroups.
            if len(slots.get(g, ())) + started.get(g, 0) >= min(cap, own_limit):
                return None
            started[g] = started.get(g, 0) + 1
            caps[g] = min(cap, own_limit)
        if pool_budget or group_budget:
            units = 1.0 if c.cost_units is None else c.cost_units
            for budget, k, ran in ((pool_budget.get(c.pool), (False, c.pool), running.pool_cost),
                                   (None if g is None else group_budget.get(g), (True, g), running.group_cost)):
                if budget is None:
                    continue
                total = used.get(k)  # type: ignore[arg-type]
                if total is None:
                    total = ran.get(k[1], 0.0)  # type: ignore[arg-type]
                    if total >= budget - BUDGET_EPS:
                        return None  # used up by what runs: left out (Selection.left_out)
                if total + units > budget + BUDGET_EPS:  # as CostBudgets.admits
                    return None
                used[k] = total + units  # type: ignore[index]  # added as CostBudgets adds: the same sums
    return [c.id for c in heads]


# Candidates a claim with budgets counts (Selection.read: what it offers, less what it leaves
# out), at most, beyond the jobs it starts: its look-ahead. Past it, a claim stops even if it
# started fewer than it could (the rest wait for the next claim), so a queue held up by its
# budgets costs a page or two, not a walk of every job.
LOOK_AHEAD = 512


def select(candidates: Iterable[Candidate], request: Request, running: Running) -> list[int]:
    """The ids that may start, in queue order, at most request.limit of them."""
    s = Selection(request, running)
    s.offer_all(candidates)
    return s.chosen
