"""Heap trim: what a run's large state left free in malloc's heaps goes back to the system."""

from __future__ import annotations

from ... import heap
from ...settings import DEFAULT_SWEEP


class TrimHeap:
    name = "heap_trim"

    def __init__(self, *, interval: float = DEFAULT_SWEEP) -> None:
        self.interval = interval

    def run(self) -> None:
        heap.trim()
