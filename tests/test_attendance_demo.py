"""scripts/attendance-demo.py's pacing, on an injected clock (the demo itself needs nfcpy's
emulated reader and a terminal; its taps' timing does not)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "attendance-demo.py"


def _demo():
    spec = importlib.util.spec_from_file_location("attendance_demo", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Clock:
    """Time that moves only when a tap takes its time or the demo waits."""

    def __init__(self) -> None:
        self.now = 100.0
        self.taps: list[tuple[float, str]] = []

    def __call__(self) -> float:
        return self.now

    def tap(self, name: str, takes: float) -> None:
        self.taps.append((self.now, name))
        self.now += takes

    def wait(self, seconds: float) -> bool:  # threading.Event.wait: True once stopped
        self.now += seconds
        return len(self.taps) >= 4


def test_attendance_demo_taps_at_its_interval():
    demo, clock = _demo(), _Clock()
    # A tap takes as long as the terminal takes to read the card: 0.1 s here.
    demo.tap_in_turns(lambda name: clock.tap(name, 0.1), 5.0, clock, clock=clock)
    assert clock.taps == [(100.0, "Alice"), (105.0, "Bob"), (110.0, "Alice"), (115.0, "Bob")]


def test_attendance_demo_taps_again_at_once_after_a_tap_longer_than_its_interval():
    demo, clock = _demo(), _Clock()
    demo.tap_in_turns(lambda name: clock.tap(name, 7.0), 5.0, clock, clock=clock)
    assert [t for t, _ in clock.taps] == [100.0, 107.0, 114.0, 121.0]
