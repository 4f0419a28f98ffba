"""The settings of a daemon and of a worker: the checks both share refuse the same values."""

import pytest

from queickd import startcheck
from queickd.services import workerproc
from queickd.settings import Config, WorkerConfig

CHECKS = [startcheck.validate, workerproc.validate]
STORE = "postgresql://nobody@127.0.0.1/none"  # never connected to: validation comes first


@pytest.mark.parametrize("validate", CHECKS, ids=["daemon", "worker"])
@pytest.mark.parametrize("changed, said", [
    ({"pause_cooldown": 0.0}, "pause_cooldown must be positive"),
    ({"pause_after": -1}, "pause_after must not be negative"),
    ({"app_dir": "/no/such/dir"}, "app directory '/no/such/dir' does not exist"),
])
def test_a_setting_both_share_is_refused_by_both(validate, changed, said):
    config = (Config if validate is startcheck.validate else WorkerConfig)(store=STORE, **changed)
    with pytest.raises(ValueError, match=said):
        validate(config)


@pytest.mark.parametrize("validate", CHECKS, ids=["daemon", "worker"])
def test_the_defaults_pass_the_checks(validate):
    validate((Config if validate is startcheck.validate else WorkerConfig)(store=STORE))


def test_a_worker_and_a_daemon_default_alike_where_they_share_a_setting():
    shared = ("workers", "pool", "heartbeat", "sweep", "max_orphan_requeues", "stop_timeout", "pause_after",
              "pause_cooldown", "memory_reserve", "idle_grace", "budget_patience", "isolation")
    assert {n: getattr(WorkerConfig(), n) for n in shared} == {n: getattr(Config(), n) for n in shared}
