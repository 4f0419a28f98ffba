"""A held job cancelled on the edge while its batch is on its way to the central: the
central has taken it, and it is cancelled there too, so a job cancelled on the edge does
not run. A real central daemon; the edge's store cancels the job at the moment the
forwarder marks its batch forwarded, which is where the race lands."""

from __future__ import annotations

import time

from helpers import DaemonProcess

from queickd.core.job import NewJob, State
from queickd.services.forwarder.forwarder import Forwarder
from queickd.services.forwarder.settings import parse
from queickd.store.sqlite.store import SQLiteStore


class CancelledInFlight(SQLiteStore):
    """Cancels each job of a batch just before the batch is marked forwarded."""

    def mark_forwarded(self, pairs):
        for local, _ in pairs:
            self.cancel(local, time.time())
        return super().mark_forwarded(pairs)


def test_a_job_cancelled_while_its_batch_is_sent_is_cancelled_upstream(tmp_path):
    central = DaemonProcess(f"sqlite:///{tmp_path / 'central.db'}", "--workers", "0").start()
    try:
        edge = CancelledInFlight(str(tmp_path / "edge.db"))
        (held,) = edge.submit([NewJob("testjobs:noop", held=True)], time.time())
        forwarder = Forwarder(edge, parse({"url": f"queickd://127.0.0.1:{central.port}", "functions": ["*"],
                                           "identity": "edge-1"}))
        forwarder._round()
        assert edge.get(held.job_id).state == State.CANCELLED
        with central.client() as q:
            (upstream,) = q.jobs()
        assert upstream["state"] == State.CANCELLED
    finally:
        central.close()
