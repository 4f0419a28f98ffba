"""The peers of bench/workflows.py: huey 3.5.4's pipelines and Celery 5.7.0's canvas, each
run end to end in its own virtualenv (the same three measurements as queickd's: plain jobs,
10-step chains, a fan-out). See bench/workflows.py for what is measured and how.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench.peers import CELERY_VERSION
from bench.processes import _clean_env, log, stop_group

# --- huey's pipelines -----------------------------------------------------------------------
HUEY_APP = '''
from huey import SqliteHuey
huey = SqliteHuey("bench", filename={db!r}, fsync=True)

@huey.task()
def step(*a):
    return 1  # huey stores no None result, and a result is what a caller waits for
'''

HUEY_CLIENT = '''
import json, sys, time
sys.path.insert(0, {d!r})
from hueyjobs import huey, step
runs, items = {runs}, {items}
t0 = time.perf_counter()
results = []
for _ in range(runs):
    p = step.s()
    for _ in range(9):
        p = p.then(step)
    results.append(huey.enqueue(p))
for r in results:
    r.get(blocking=True, timeout=600)  # a pipeline's results, once its last step ran
chain = runs * 10 / (time.perf_counter() - t0)
t0 = time.perf_counter()
group = step.map([(i,) for i in range(items)])
group.get(blocking=True, timeout=600)
fan = items / (time.perf_counter() - t0)
t0 = time.perf_counter()
plain = [step() for _ in range({jobs})]
for r in plain:
    r.get(blocking=True, timeout=600)
print(json.dumps({{"chain_steps_per_s": chain, "fan_out_items_per_s": fan,
                  "plain_jobs_per_s": {jobs} / (time.perf_counter() - t0)}}))
'''


def huey(venv: Path, runs: int, items: int, jobs: int) -> dict[str, float] | None:
    consumer = venv / "bin" / "huey_consumer"
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "hueyjobs.py").write_text(HUEY_APP.format(db=f"{d}/huey.db"))
        proc = subprocess.Popen([str(consumer), "hueyjobs.huey", "-w", "4", "-k", "thread"], cwd=d,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            for line in proc.stderr:  # type: ignore[union-attr]
                if "Huey consumer started" in line:
                    break
            else:  # its stderr closed: the consumer ended before it started
                log("huey: the consumer did not start; skipped")
                return None
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
            out = run_client("huey", venv / "bin" / "python", HUEY_CLIENT.format(d=d, runs=runs, items=items, jobs=jobs),
                             d)
            if out is None:
                return None
        finally:
            stop_group(proc, 30)
    return with_ratios(out)


# --- Celery's canvas ------------------------------------------------------------------------
CELERY_BROKER = "amqp://guest:guest@127.0.0.1:5672//"
CELERY_RESULTS = "redis://127.0.0.1:6379/7"  # a database of the bench's own, flushed before each run
CELERY_QUEUE = "queickd-bench-workflows"  # purged before each run
CELERY_TARGET = f"Celery {CELERY_VERSION} canvas (RabbitMQ broker, Redis results)"
CELERY_READY = re.compile(r"\bready\.")

CELERY_APP = '''
import logging
from celery import Celery, signals
# Celery's defaults otherwise: on RabbitMQ a durable queue and persistent messages
# (delivery_mode 2), a message acked just before its task runs (acks_late off), prefetch 4
# per worker.
app = Celery("celeryjobs", broker={broker!r}, backend={results!r})
app.conf.task_default_queue = {queue!r}
app.conf.broker_connection_retry_on_startup = True

@signals.worker_ready.connect
def ready(**_):  # the worker runs at Celery's default log level, WARNING, which hides its own "ready."
    logging.getLogger("celeryjobs").warning("worker ready.")

@app.task
def step(*a):
    return 1  # a chain passes each step's result on to the next step
'''

CELERY_PREPARE = '''
import sys
sys.path.insert(0, {d!r})
from celeryjobs import app
app.backend.client.flushdb()
with app.connection_for_write() as conn:
    conn.ensure_connection(max_retries=1)
    with conn.channel() as ch:
        app.amqp.queues[{queue!r}](ch).declare()
        print(app.amqp.queues[{queue!r}](ch).purge() or 0)
'''

CELERY_CLIENT = '''
import json, sys, time
sys.path.insert(0, {d!r})
from celery import chain, group
from celeryjobs import step
runs, items = {runs}, {items}
t0 = time.perf_counter()
results = [chain(*[step.s() for _ in range(10)]).apply_async() for _ in range(runs)]
for r in results:
    assert r.get(timeout=600) == 1  # a chain's result: its last step's, once that ran
chain_rate = runs * 10 / (time.perf_counter() - t0)
t0 = time.perf_counter()
g = group(step.s(i) for i in range(items)).apply_async()
assert g.get(timeout=600) == [1] * items
fan = items / (time.perf_counter() - t0)
t0 = time.perf_counter()
plain = [step.delay() for _ in range({jobs})]
for r in plain:
    assert r.get(timeout=600) == 1
print(json.dumps({{"chain_steps_per_s": chain_rate, "fan_out_items_per_s": fan,
                  "plain_jobs_per_s": {jobs} / (time.perf_counter() - t0)}}))
'''


def _reachable(url: str, default_port: int) -> str | None:
    """None if url's host:port accepts a TCP connection, else why not."""
    from urllib.parse import urlsplit

    u = urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or default_port
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as e:
        return f"{host}:{port} unreachable ({e})"
    return None


def celery(venv: Path, runs: int, items: int, jobs: int, broker: str = CELERY_BROKER,
           results: str = CELERY_RESULTS) -> dict[str, float] | None:
    """Celery's canvas: a worker `celery -A celeryjobs worker --pool threads --concurrency 4`
    in a temp dir (its own session), the client under the venv's python. None, with the
    reason logged, when the broker or the result store cannot be reached."""
    for url, port in ((broker, 5672), (results, 6379)):
        why = _reachable(url, port)
        if why is not None:
            log(f"celery: {why}; skipped")
            return None
    py = venv / "bin" / "python"
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "celeryjobs.py").write_text(CELERY_APP.format(broker=broker, results=results, queue=CELERY_QUEUE))
        env = _clean_env()
        res = subprocess.run([str(py), "-c", CELERY_PREPARE.format(d=d, queue=CELERY_QUEUE)], cwd=d, env=env,
                             capture_output=True, text=True, timeout=120)
        if res.returncode:
            why = (res.stderr.strip().splitlines() or ["no output"])[-1]
            log(f"celery: cannot prepare the broker and result store ({why}); skipped")
            return None
        log(f"celery: {results} flushed, queue {CELERY_QUEUE} purged ({res.stdout.strip()} messages)")
        worker_log = Path(d) / "worker.log"
        cmd = [str(venv / "bin" / "celery"), "-A", "celeryjobs", "worker", "--pool", "threads",
               "--concurrency", "4", "--hostname", f"bench-workflows-{os.getpid()}@%h"]
        with open(worker_log, "wb") as logf:
            proc = subprocess.Popen(cmd, cwd=d, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while not CELERY_READY.search(worker_log.read_text(errors="replace")):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log(f"celery: the worker did not get ready; skipped:\n{worker_log.read_text(errors='replace')[-2000:]}")
                    return None
                time.sleep(0.05)
            out = run_client("celery", py, CELERY_CLIENT.format(d=d, runs=runs, items=items, jobs=jobs), d, env)
            if out is None:
                return None
        finally:
            stop_group(proc, 60)
        text = worker_log.read_text(errors="replace")
        errors = [ln for ln in text.splitlines() if "ERROR" in ln or "Traceback" in ln or "CRITICAL" in ln]
        log(f"celery: worker log {len(text.splitlines())} lines, {len(errors)} with errors"
            + "".join(f"\n  {ln}" for ln in errors[:20]))
    return with_ratios(out)


def run_client(name: str, python: Path, script: str, cwd: str, env: dict[str, str] | None = None
               ) -> dict[str, float] | None:
    """A peer's client script run with its venv's python: the JSON of its last line, or None
    (logged) if it failed."""
    res = subprocess.run([str(python), "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=1800)
    if res.returncode:
        log(f"{name}: client failed: {res.stderr[-2000:]}")
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])


def with_ratios(out: dict[str, float]) -> dict[str, float]:
    out["chain_vs_plain"] = out["chain_steps_per_s"] / out["plain_jobs_per_s"]
    out["fan_out_vs_plain"] = out["fan_out_items_per_s"] / out["plain_jobs_per_s"]
    return out
