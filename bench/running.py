"""The scenarios where jobs run: end to end, enqueue->start latency, idle cost and kill -9
recovery, each against a target started by serve(). They add metrics to the results and
never print the report.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.peers import HUEY, QUEICK, QUEICKD_TARGETS, HueyConsumer, QueickServer, write_huey_app
from bench.processes import (
    PROBES,
    QueickdDaemon,
    _clean_env,
    _kill_group,
    _reap,
    _spawn,
    group_pids,
    group_usage,
    proc_written,
    run_probe,
)
from bench.scenarios import Settings, _fresh_dir

if TYPE_CHECKING:
    from bench.report import Results


# --- end to end, latency, idle, crash: every target runs jobs --------------------------------------
@dataclass
class Served:
    """A started target: how to run its probes and which process group it is."""

    target: str
    python: Path | str  # the Python its client probes run under
    kind: str  # probe kind prefix: queickd / queick / huey
    args: list[str]  # probe arguments that reach it
    cwd: Path | None  # the probe's working directory
    pgid: int
    handle: Any  # QueickdDaemon / QueickServer / HueyConsumer

    def probe(self, what: str, *args: str, timeout: float) -> dict[str, Any]:
        return run_probe(self.python, f"{self.kind}-{what}", *self.args, *args, cwd=self.cwd, timeout=timeout)


@contextlib.contextmanager
def serve(s: Settings, target: str, d: Path, workers: int = 4) -> Any:
    """Start target (queickd with `workers` workers, Queick with its defaults, huey's
    consumer with 4 threads, or none with workers=0) in data dir d; killed on leaving, on
    error too."""
    if target in QUEICKD_TARGETS:
        store, durability = QUEICKD_TARGETS[target]
        with QueickdDaemon(store, d, workers=workers, durability=durability) as daemon:
            yield Served(target, sys.executable, "queickd", ["--port", str(daemon.port), "--dir", str(d)], None,
                         daemon.pid, daemon)
    elif target == QUEICK:
        python = s.peer()
        with QueickServer(s.venv, d) as srv:
            assert srv.proc is not None
            yield Served(target, python, "queick", ["--dir", str(d)], d, srv.proc.pid, srv)
    elif target == HUEY and workers == 0:  # no consumer: its clients only insert
        python = s.huey()
        write_huey_app(d, python)
        yield Served(target, python, "huey", ["--dir", str(d)], d, 0, None)
    elif target == HUEY:
        python = s.huey()
        with HueyConsumer(s.huey_venv, d) as consumer:
            assert consumer.proc is not None
            yield Served(target, python, "huey", ["--dir", str(d)], d, consumer.proc.pid, consumer)
    else:
        raise ValueError(target)


def _group_cpu(pgid: int) -> float:
    if not pgid:  # a target with no process of its own (huey's clients without a consumer)
        return 0.0
    return sum(cpu for cpu, _ in group_usage(pgid).values())


def _group_written(pgid: int) -> int:
    """Bytes the live processes of a process group have dirtied in files so far."""
    return sum(proc_written(p) for p in group_pids(pgid)) if pgid else 0


def _peer(scenario: str, target: str, label: str) -> tuple[str, str, str] | None:
    return (scenario, QUEICK, label) if target not in (QUEICK, HUEY) else None


E2E_SINGLE = "rate (one enqueue per job)"
E2E_MANY = "rate (enqueue_many, batched)"


def run_e2e(s: Settings, res: Results, scenario: str, target: str, batched: bool = False) -> None:
    """N append-byte jobs with 4 workers running them. Every target gets one enqueue per job
    (the like-for-like headline) unless `batched`: queickd's enqueue_many in chunks."""
    n = s.e2e_jobs
    label = E2E_MANY if batched else E2E_SINGLE
    timeout = 60.0 + n / 20  # 20 jobs/s is far below anything seen; still bounded
    mode = ["--mode", "many" if batched else "single"] if target in QUEICKD_TARGETS else []
    with _fresh_dir(s, "e2e") as d, serve(s, target, Path(d)) as srv:
        cpu0, written0 = _group_cpu(srv.pgid), _group_written(srv.pgid)
        probe = srv.probe("e2e", "--n", str(n), "--chunk", str(s.chunk), "--max-seconds", str(timeout - 10),
                          *mode, timeout=timeout)
        server_cpu, written = _group_cpu(srv.pgid) - cpu0, _group_written(srv.pgid) - written0
    if probe["final_bytes"] != n:
        raise RuntimeError(f"{probe['final_bytes']} bytes for {n} jobs: some job ran twice")
    total_cpu = server_cpu + probe["client_cpu_s"]
    base = scenario.removesuffix("-many")  # the batched row is compared with Queick one at a time
    res.add(scenario, label, target, "jobs/s", probe["rate"], higher_is_better=True,
            peer=(base, QUEICK, E2E_SINGLE) if target not in (QUEICK, HUEY) else None,
            raw={**probe, "server_cpu_s": server_cpu})
    res.add(scenario, "CPU per job (server+client)", target, "µs", total_cpu / n * 1e6, higher_is_better=False,
            peer=_peer(scenario, target, "CPU per job (server+client)"))
    res.add(scenario, "written per job (server+client)", target, "bytes",
            (written + probe.get("client_written", 0)) / n, higher_is_better=False,
            peer=_peer(scenario, target, "written per job (server+client)"))
    if "retried" in probe:  # huey's client: calls that failed with "database is locked", retried
        res.add(scenario, "calls failed and retried", target, "calls", probe["retried"], higher_is_better=False)


def run_latency(s: Settings, res: Results, scenario: str, target: str) -> None:
    n, interval = s.latency_samples, 0.05
    with _fresh_dir(s, "latency") as d, serve(s, target, Path(d)) as srv:
        probe = srv.probe("latency", "--n", str(n), "--interval", str(interval), timeout=90.0 + n * interval)
    for key in ("p50", "p90", "p99"):
        label = f"enqueue→start {key}"
        res.add(scenario, label, target, "ms", probe[f"{key}_ms"], higher_is_better=False,
                peer=_peer(scenario, target, label), raw=probe if key == "p50" else None)
    res.add(scenario, "sent, never ran within 30 s", target, "jobs", probe.get("never_ran", 0), higher_is_better=False,
            peer=_peer(scenario, target, "sent, never ran within 30 s"))


def run_idle(s: Settings, res: Results, scenario: str, target: str) -> None:
    with _fresh_dir(s, "idle") as d, serve(s, target, Path(d)) as srv:
        time.sleep(s.idle_warmup)
        u0, t0 = group_usage(srv.pgid), time.monotonic()
        time.sleep(s.idle_seconds)
        u1, t1 = group_usage(srv.pgid), time.monotonic()
    per_min = 60.0 / (t1 - t0)
    # processes present at both samples (a process that came or went in between is left out
    # and counted in the raw data)
    both = set(u0) & set(u1)
    cpu = sum(u1[p][0] - u0[p][0] for p in both)
    cs = sum(u1[p][1] - u0[p][1] for p in both)
    raw = {"warmup_s": s.idle_warmup, "measured_s": t1 - t0, "processes": sorted(both),
           "appeared_or_left": sorted(set(u0) ^ set(u1)), "cpu_s": cpu, "ctx_switches": cs}
    res.add(scenario, "CPU", target, "ms/min", cpu * 1000 * per_min, higher_is_better=False,
            peer=_peer(scenario, target, "CPU"), raw=raw)
    res.add(scenario, "context switches", target, "/min", cs * per_min, higher_is_better=False,
            peer=_peer(scenario, target, "context switches"))


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def _queue_empty(srv: Served) -> bool:
    """Nothing waiting or running, as far as the target can tell (Queick: nothing to ask)."""
    if srv.target == QUEICK:
        return True
    if srv.target == HUEY:
        return srv.handle.pending() == 0
    from queickd import JobQueue

    with JobQueue("127.0.0.1", srv.handle.port, timeout=10.0) as q:
        counts = q.stats()["counts"]
    return not any(counts.get(k, 0) for k in ("queued", "running", "scheduled", "waiting_network"))


def run_crash(s: Settings, res: Results, scenario: str, target: str) -> None:
    """A client enqueues append_line(tokens.out, token) one at a time and logs each ack;
    after s.crash_acks acks the target's whole process group gets SIGKILL; it restarts on
    the same data dir and drains; then acknowledged tokens never run and tokens run more
    than once are counted."""
    with _fresh_dir(s, "crash") as tmp:
        d = Path(tmp)
        acked_file, out_file = d / "acked.txt", d / "tokens.out"
        with serve(s, target, d) as srv:
            client = _spawn([str(srv.python), str(PROBES), f"{srv.kind}-crash", *srv.args, "--n", "1000000",
                             "--max-seconds", "300"], cwd=srv.cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_clean_env(srv.kind == "queickd"))
            try:
                deadline = time.monotonic() + 240.0
                while _count_lines(acked_file) < s.crash_acks:
                    if client.poll() is not None:
                        raise RuntimeError(f"crash client exited early:\n{client.communicate()[1][-2000:]}")
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"fewer than {s.crash_acks} acks in 240 s")
                    time.sleep(0.005)
                _kill_group(srv.handle.proc)  # kill -9: the daemon and anything it forked
                t_kill = time.monotonic()
                (d / "stop").touch()  # huey's client writes to the file itself: stop it too
                out, err = client.communicate(timeout=30.0)
            finally:
                _kill_group(client)
                _reap(client)
            if client.returncode != 0:
                raise RuntimeError(f"crash client failed with {client.returncode}:\n{err[-2000:]}")
            probe = json.loads([ln for ln in out.splitlines() if ln.strip()][-1])
            _reap(srv.handle.proc)
            # Queick's forked receiver must be gone (and 9999 free) before the restart
            if target == QUEICK:
                srv.handle.__exit__()
        ran_before_restart = _count_lines(out_file)
        with serve(s, target, d) as srv2:
            t_up = time.monotonic()
            acked = acked_file.read_text().split()
            want = set(acked)
            deadline, last_size, stable_since = time.monotonic() + 120.0, -1, time.monotonic()
            while time.monotonic() < deadline:
                text = out_file.read_text() if out_file.exists() else ""
                if want <= set(text.split()):
                    break
                if len(text) != last_size:
                    last_size, stable_since = len(text), time.monotonic()
                elif time.monotonic() - stable_since > 3.0 and _queue_empty(srv2):
                    break
                time.sleep(0.05)
            else:
                raise TimeoutError("the queue did not drain within 120 s of the restart")
            drained = time.monotonic() - t_up
    ran = text.split()
    counts: dict[str, int] = {}
    for tok in ran:
        counts[tok] = counts.get(tok, 0) + 1
    lost = [t for t in acked if t not in counts]
    dup = [t for t, c in counts.items() if c > 1]
    raw = {**probe, "acked": len(acked), "lines_run": len(ran), "ran_before_restart": ran_before_restart,
           "lost": len(lost), "lost_sample": lost[:20], "run_twice_or_more": len(dup), "dup_sample": dup[:20],
           "ran_unacked": len(set(counts) - want), "restart_to_drained_s": drained,
           "kill_to_restart_s": t_up - t_kill}
    res.add(scenario, "acknowledged before kill", target, "jobs", len(acked), higher_is_better=True, raw=raw)
    res.add(scenario, "acknowledged, never ran", target, "jobs", len(lost), higher_is_better=False,
            peer=_peer(scenario, target, "acknowledged, never ran"))
    res.add(scenario, "ran more than once", target, "jobs", len(dup), higher_is_better=False,
            peer=_peer(scenario, target, "ran more than once"))
    res.add(scenario, "restart to drained", target, "s", drained, higher_is_better=False)


