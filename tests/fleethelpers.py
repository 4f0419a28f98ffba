"""External workers (`python -m queickd worker`) as real subprocesses, for the fleet tests."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from helpers import JOBS_DIR, STARTED, DaemonProcess


class WorkerProcess(DaemonProcess):
    """`queick worker` on a PostgreSQL store; opens no port, so it is ready once it logs
    that it serves its pools."""

    def __init__(self, store_url: str, *pools: str, workers: int = 2, heartbeat: float = 0.5,
                 extra: tuple[str, ...] = ()) -> None:
        super().__init__(store_url, workers=workers)
        self.pools = pools or ("default",)
        self.heartbeat = heartbeat
        self.extra = list(extra)

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "queickd", "worker", "--store", self.store_url, "--app-dir", str(JOBS_DIR),
               "--workers", str(self.workers), "--heartbeat", str(self.heartbeat), "--log-level", "debug"]
        for p in self.pools:
            cmd += ["--pool", p]
        return cmd + self.extra

    def spawn(self) -> WorkerProcess:
        """Start without waiting for readiness (for a worker expected to refuse)."""
        import queue

        env = {**os.environ}
        env.pop("JOURNAL_STREAM", None)
        self.lines, self._lines_q = [], queue.Queue()
        self.proc = subprocess.Popen(self.command(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL, text=True, env=env)
        STARTED.append(self)
        threading.Thread(target=self._read, args=(self.proc, self._lines_q), daemon=True).start()
        return self

    def start(self, timeout: float = 20.0) -> WorkerProcess:
        self.spawn()
        self.wait_for_line("worker serving pool", timeout)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid
