"""The many-clients scenarios: K client processes (16), each sending its jobs one request at
a time and waiting for every ack, against one target; with workers running the jobs (timed
until every job ran) or with none (timed until the last ack). Also the slowed-disk runs of
many-clients and end to end (`--slow-fsync`). It adds metrics to the results and never
prints the report.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bench.peers import HUEY, QUEICK, QUEICKD_TARGETS
from bench.processes import BENCH_DIR, _clean_env, _kill_group, _reap, _spawn, slow_fsync
from bench.running import _group_cpu, run_e2e, serve
from bench.scenarios import Settings, _fresh_dir

if TYPE_CHECKING:
    from bench.report import Results

CLIENT_PROBE = BENCH_DIR / "client_probe.py"
RATE = "rate (one request at a time per client)"


def run_many_clients(s: Settings, res: Results, scenario: str, target: str, workers: int) -> None:
    """s.clients processes send s.client_jobs jobs each; with workers > 0 the jobs append a
    byte to a file and the clock stops when it holds them all, else at the last ack."""
    k, per = s.clients, s.client_jobs
    total = k * per
    timeout = 120.0 + total / 50  # far below anything seen, still bounded
    with _fresh_dir(s, "many") as tmp, serve(s, target, Path(tmp), workers=workers) as srv:
        d = Path(tmp)
        port = ["--port", str(srv.handle.port)] if target in QUEICKD_TARGETS else []
        job = "append" if workers else "noop"
        clients = [
            _spawn([str(srv.python), str(CLIENT_PROBE), srv.kind, "--dir", str(d), "--index", str(i), "--n",
                    str(per), "--job", job, "--max-seconds", str(timeout), *port],
                   cwd=srv.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                   env=_clean_env(srv.kind == "queickd"))
            for i in range(k)
        ]
        try:
            _wait_ready(d, clients, timeout=60.0)
            cpu0 = _group_cpu(srv.pgid)
            t0 = time.monotonic()
            (d / "go").touch()
            results = [_result(c, timeout) for c in clients]
            t_acked = time.monotonic()
            out = d / "e2e.out"
            if workers:
                deadline = t0 + timeout
                while _size(out) < total:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{_size(out)} of {total} jobs ran in {timeout:.0f} s")
                    time.sleep(0.002)
            t_done = time.monotonic()
            server_cpu = _group_cpu(srv.pgid) - cpu0
            if workers:
                time.sleep(0.2)  # anything running twice would show up as extra bytes
                if _size(out) != total:
                    raise RuntimeError(f"{_size(out)} bytes for {total} jobs: some job ran twice")
        finally:
            for c in clients:
                _kill_group(c)
                _reap(c)
    client_cpu = sum(r["client_cpu_s"] for r in results)
    peer = (scenario, QUEICK, RATE) if target not in (QUEICK, HUEY) and workers else None
    raw = {"clients": k, "jobs_per_client": per, "seconds": t_done - t0, "acked_s": t_acked - t0,
           "server_cpu_s": server_cpu, "client_cpu_s": client_cpu, "workers": workers,
           "retried": [r.get("retried", 0) for r in results]}
    res.add(scenario, RATE, target, "jobs/s", total / (t_done - t0), higher_is_better=True, peer=peer, raw=raw)
    res.add(scenario, "calls failed and retried", target, "calls", sum(r.get("retried", 0) for r in results),
            higher_is_better=False)
    if srv.pgid:
        res.add(scenario, "server CPU per job", target, "µs", server_cpu / total * 1e6, higher_is_better=False,
                peer=(scenario, QUEICK, "server CPU per job") if peer else None)


def run_slowed(s: Settings, res: Results, scenario: str, target: str) -> None:
    """many-clients (enqueue only) or end to end (one enqueue a job; sd-e2e-many: batched)
    with every fsync of the target slowed."""
    with slow_fsync(s.slow_fsync_ms):
        if scenario == "sd-many-clients":
            run_many_clients(s, res, scenario, target, workers=0)
        else:
            run_e2e(s, res, scenario, target, batched=scenario == "sd-e2e-many")


def _size(path: Path) -> int:
    with contextlib.suppress(FileNotFoundError):
        return os.path.getsize(path)
    return 0


def _wait_ready(d: Path, clients: list[subprocess.Popen], timeout: float) -> None:
    """Every client connected (its ready file exists) before the clock starts."""
    deadline = time.monotonic() + timeout
    while sum(1 for i in range(len(clients)) if (d / f"ready.{i}").exists()) < len(clients):
        for c in clients:
            if c.poll() is not None:
                raise RuntimeError(f"a client exited before the start:\n{c.communicate()[1][-2000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the clients were not ready within {timeout:.0f} s")
        time.sleep(0.01)


def _result(client: subprocess.Popen, timeout: float) -> dict:
    out, err = client.communicate(timeout=timeout)
    if client.returncode != 0:
        raise RuntimeError(f"a client failed with {client.returncode}:\n{err[-2000:]}")
    return json.loads([ln for ln in out.splitlines() if ln.strip()][-1])
