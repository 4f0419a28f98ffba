"""The store contract's shape: roles small enough to read on one screen, each method in
one role and said, every backend implementing every role, each capability where it is."""

from __future__ import annotations

import pytest

from queickd.store import contract
from queickd.store.contract.capabilities import ClaimsInSubmit, PassInOneCall
from queickd.store.contract.fleet import FleetStore
from queickd.store.postgres.store import PostgresStore
from queickd.store.sqlite.store import SQLiteStore

ROLES = (contract.Lifecycle, contract.Queue, contract.Schedule, contract.Operator, contract.Inspect,
         contract.Resources, contract.Workflows, contract.Forwarding, FleetStore, PassInOneCall, ClaimsInSubmit)
MOST_METHODS = 15


def _own_methods(role: type) -> dict[str, object]:
    return {n: v for n, v in vars(role).items() if callable(v) and not n.startswith("_")}


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.__name__)
def test_a_role_is_small_and_says_each_of_its_methods(role):
    methods = _own_methods(role)
    assert 0 < len(methods) <= MOST_METHODS
    assert [n for n, f in methods.items() if not (f.__doc__ or "").strip()] == []


def test_each_method_of_the_contract_is_in_one_role():
    seen: dict[str, str] = {}
    for role in ROLES:
        for name in _own_methods(role):
            assert name not in seen, f"{name} is in {seen[name]} and {role.__name__}"
            seen[name] = role.__name__
    assert _own_methods(contract.Store) == {}  # the union of the roles, nothing of its own


@pytest.mark.parametrize("backend", [SQLiteStore, PostgresStore], ids=lambda b: b.__name__)
def test_every_backend_implements_every_role(backend):
    wanted = {n for role in contract.Store.__mro__ if role is not object for n in _own_methods(role)}
    assert sorted(n for n in wanted if not callable(getattr(backend, n, None))) == []


def test_each_capability_is_implemented_where_it_is_one():
    assert issubclass(PostgresStore, PassInOneCall) and not issubclass(PostgresStore, ClaimsInSubmit)
    assert issubclass(SQLiteStore, ClaimsInSubmit) and not issubclass(SQLiteStore, PassInOneCall)
