"""The maintainer: each maintenance service runs once its interval has passed, in order."""

import pytest

from queickd.services.maintenance.maintainer import Maintainer


class Recorder:
    def __init__(self, name, interval, ran, fail=False):
        self.name, self.interval, self._ran, self._fail = name, interval, ran, fail

    def run(self):
        self._ran.append(self.name)
        if self._fail:
            raise OSError("store gone")


def test_each_service_runs_at_its_interval_and_a_late_tick_still_counts():
    now, ran = [100.0], []
    m = Maintainer([Recorder("every", 60.0, ran), Recorder("hourly", 3600.0, ran)], tick=60.0,
                   monotonic=lambda: now[0])
    m.run_due()  # all at the first tick
    for t in (159.0, 221.0, 279.0):  # ticks a little early or late
        now[0] = t
        m.run_due()
    assert ran == ["every", "hourly", "every", "every", "every"]
    now[0] = 3701.0
    m.run_due()
    assert ran[-2:] == ["every", "hourly"]


def test_an_error_leaves_and_the_services_after_it_run_at_the_next_tick():
    now, ran = [0.0], []
    failing = Recorder("a", 60.0, ran, fail=True)
    m = Maintainer([failing, Recorder("b", 60.0, ran)], tick=60.0, monotonic=lambda: now[0])
    with pytest.raises(OSError):
        m.run_due()
    failing._fail = False
    now[0] = 60.0
    m.run_due()
    assert ran == ["a", "a", "b"]


def test_a_service_named_twice_or_a_tick_not_positive_is_refused():
    with pytest.raises(ValueError, match="named twice"):
        Maintainer([Recorder("a", 1.0, []), Recorder("a", 1.0, [])], tick=1.0)
    with pytest.raises(ValueError, match="positive"):
        Maintainer([Recorder("a", 1.0, [])], tick=0.0)
