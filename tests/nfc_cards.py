"""Cards for the NFC tests: the package's emulated cards, presented on a thread."""

from __future__ import annotations

import threading

from queickd.attendance.emulate import felica_tap as felica
from queickd.attendance.emulate import type_a_tap as type_a

__all__ = ["felica", "present", "type_a"]


def present(card, port: int, card_id: str, hold: float) -> threading.Thread:
    t = threading.Thread(target=card, args=(port, card_id, hold), daemon=True)
    t.start()
    return t
