"""The settings of a daemon and of a worker: the checks both share refuse the same values."""

import pytest

from queickd.settings import Config, WorkerConfig
from queickd.startcheck import validate

KINDS = [Config, WorkerConfig]  # one validate() checks both
STORE = "postgresql://nobody@127.0.0.1/none"  # never connected to: validation comes first


@pytest.mark.parametrize("kind", KINDS, ids=["daemon", "worker"])
@pytest.mark.parametrize("changed, said", [
    ({"pause_cooldown": 0.0}, "pause_cooldown must be positive"),
    ({"pause_after": -1}, "pause_after must not be negative"),
    ({"app_dir": "/no/such/dir"}, "app directory '/no/such/dir' does not exist"),
])
def test_a_setting_both_share_is_refused_by_both(kind, changed, said):
    config = kind(store=STORE, **changed)
    with pytest.raises(ValueError, match=said):
        validate(config)


@pytest.mark.parametrize("kind", KINDS, ids=["daemon", "worker"])
def test_the_defaults_pass_the_checks(kind):
    validate(kind(store=STORE))


def test_a_worker_and_a_daemon_default_alike_where_they_share_a_setting():
    shared = ("workers", "pool", "heartbeat", "sweep", "max_orphan_requeues", "stop_timeout", "pause_after",
              "pause_cooldown", "memory_reserve", "idle_grace", "budget_patience", "isolation")
    assert {n: getattr(WorkerConfig(), n) for n in shared} == {n: getattr(Config(), n) for n in shared}
