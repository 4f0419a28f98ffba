"""What the protocol tests share: a fixed now, and the check that a call is refused as a bad request."""

from __future__ import annotations

import pytest

from queickd.core.protocol import Code, QueueError

NOW = 1_750_000_000.0


def bad_request(fn, *args):
    """Call fn and return the QueueError it raised, asserting its code is bad_request."""
    with pytest.raises(QueueError) as info:
        fn(*args)
    assert info.value.code == Code.BAD_REQUEST
    return info.value
