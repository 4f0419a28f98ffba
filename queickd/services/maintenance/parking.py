"""Parking: jobs that parked for the network while the checker still said it was up (their
own server was down, or the checker had not noticed yet) are released once it is up."""

from __future__ import annotations

from ...settings import DEFAULT_SWEEP
from ..network import NetworkParking


class ReleaseParked:
    name = "parking"

    def __init__(self, parking: NetworkParking, *, interval: float = DEFAULT_SWEEP) -> None:
        self.parking = parking
        self.interval = interval

    def run(self) -> None:
        self.parking.on_sweep()
