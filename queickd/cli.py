"""`queick`: run the daemon (the default, as Queick did) or talk to a running one.

Every flag can also come from the environment: --some-flag reads QUEICKD_SOME_FLAG.
Exit status: 0 success; 1 the daemon refused or could not be reached; 2 bad usage;
78 (EX_CONFIG) a configuration error at start-up, which systemd should not restart.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import __version__, log
from .client import JobQueue
from .daemon import Config, Daemon
from .job import State
from .protocol import QueueError
from .retry import POLICIES

EX_CONFIG = 78
_DEFAULTS = Config()
_SUBCOMMANDS = ("run", "enqueue", "jobs", "show", "cancel", "retry", "stats", "crons", "dead", "purge",
                "resume")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration(text: str) -> float:
    """'90', '90s', '15m', '12h', '7d', '2w' → seconds."""
    t = text.strip().lower()
    try:
        return float(t[:-1]) * _UNITS[t[-1]] if t and t[-1] in _UNITS else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90, 15m, 12h or 7d") from None


def _env(flag: str) -> str | None:
    return os.environ.get("QUEICKD_" + flag.lstrip("-").upper().replace("-", "_"))


def _opt(p: argparse.ArgumentParser, flag: str, help: str, default: Any = None,
         type: Callable[[str], Any] = str, **kw: Any) -> None:
    """Add a flag whose default comes from QUEICKD_<FLAG> first, then `default`."""
    env = _env(flag)
    value = default
    if env is not None:
        try:
            value = env.split(",") if kw.get("action") == "append" else type(env)
        except (ValueError, argparse.ArgumentTypeError) as e:
            p.error(f"QUEICKD_{flag.lstrip('-').upper().replace('-', '_')}={env!r}: {e}")
    envname = "QUEICKD_" + flag.lstrip("-").upper().replace("-", "_")
    shown = "" if default in (None, [], "") else f" (default: {default})"
    p.add_argument(flag, default=value, type=type, help=f"{help}{shown} [env {envname}]", **kw)


def _daemon_flags(p: argparse.ArgumentParser) -> None:
    d = _DEFAULTS
    _opt(p, "--store", "store URL: sqlite:///path.db, memory://", d.store)
    _opt(p, "--durability", "SQLite sync: full survives power loss; normal may lose the last "
         "commits on power loss (never on a crash)", d.durability, choices=("full", "normal"))
    _opt(p, "--bind", "address to listen on (keep loopback unless you set --token-file)", d.bind)
    _opt(p, "--port", "TCP port of the enqueue protocol (0 picks a free one)", d.port, type=int)
    _opt(p, "--workers", "worker threads running jobs", d.workers, type=int)
    _opt(p, "--app-dir", "directory whose modules may run as jobs", d.app_dir)
    _opt(p, "--allow", "also allow modules matching this pattern (fnmatch, repeatable), "
         "e.g. 'queickd.attendance.*'", None, action="append")
    _opt(p, "--token-file", "file holding a token that clients must send in hello", None)
    _opt(p, "--stop-timeout", "seconds running jobs get to finish on SIGTERM", d.stop_timeout, type=float)
    _opt(p, "--max-orphan-requeues", "times a job left running by a crash is re-queued before "
         "it is dead", d.max_orphan_requeues, type=int)
    _opt(p, "--sweep", "seconds between safety sweeps of an idle daemon", d.sweep, type=float)
    _opt(p, "--ping-host", "start the network checker: HOST[:PORT] (TCP connect, port 80) or "
         "icmp://HOST; jobs with retry_on_network wait for the network", None)
    _opt(p, "--ping-interval", "seconds between network probes", d.ping_interval, type=float)
    _opt(p, "--max-queued", "waiting jobs in all before enqueue answers queue_full", d.max_queued, type=int)
    _opt(p, "--max-queued-per-key", "waiting jobs per key before enqueue answers queue_full",
         d.max_queued_per_key, type=int)
    _opt(p, "--idempotency-ttl", "how long an idempotency key names its job (e.g. 24h)",
         d.idempotency_ttl, type=duration)
    _opt(p, "--event-max-attempts", "delivery attempts of an event before it is a dead letter",
         d.event_max_attempts, type=int)
    _opt(p, "--pause-after", "failed runs in a row that pause a key or function", d.pause_after, type=int)
    _opt(p, "--keep-finished", "how long succeeded and cancelled jobs are kept (e.g. 7d)",
         d.keep_finished, type=duration)
    _opt(p, "--log-level", "log level", "info", choices=log.LEVELS)


def _client_flags(p: argparse.ArgumentParser) -> None:
    _opt(p, "--host", "daemon host", "127.0.0.1")
    _opt(p, "--port", "daemon port", _DEFAULTS.port, type=int)
    _opt(p, "--token-file", "file holding the daemon's token", None)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def _json_arg(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            v = json.loads(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
        if not isinstance(v, kind):
            raise argparse.ArgumentTypeError(f"must be a JSON {'array' if kind is list else 'object'}")
        return v
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="queick",
        description="queickd: a durable job-queue daemon for edge devices. With no command, "
        "runs the daemon (same as 'queick run').",
        epilog="Run 'queick COMMAND --help' for a command's flags.",
    )
    p.add_argument("--version", action="version", version=f"queickd {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="run the daemon (the default)",
                         description="Run the daemon in the foreground until SIGTERM/SIGINT.")
    _daemon_flags(run)

    enq = sub.add_parser("enqueue", help="queue a job", description="Queue one job and print its id.")
    enq.add_argument("func", help="module:function to run (module.function works too)")
    enq.add_argument("--args", type=_json_arg(list), default=[], help="positional arguments, a JSON array")
    enq.add_argument("--kwargs", type=_json_arg(dict), default={}, help="keyword arguments, a JSON object")
    when = enq.add_mutually_exclusive_group()
    when.add_argument("--delay", type=float, help="run after this many seconds")
    when.add_argument("--run-at", type=float, help="run at this unix time")
    enq.add_argument("--retry", choices=POLICIES, help="retry on failure with this backoff policy")
    enq.add_argument("--max-attempts", type=int, help="runs in all, the first included (with --retry)")
    enq.add_argument("--key", help="serial key")
    enq.add_argument("--idempotency-key", help="a second enqueue with this key returns the first job")
    enq.add_argument("--manual", action="store_true",
                     help="an operator's run: refused (conflict) if its key already has a job; resumes a pause")
    enq.add_argument("--wait", type=float, metavar="SECONDS", help="wait for the job to finish and print it")
    _client_flags(enq)

    jobs = sub.add_parser("jobs", help="list jobs, newest first", description="List jobs, newest first.")
    jobs.add_argument("--state", choices=State.ALL, help="only jobs in this state")
    jobs.add_argument("--limit", type=int, default=50, help="at most this many (default: 50)")
    _client_flags(jobs)

    for name, text in (("show", "show one job in full"), ("cancel", "cancel a job that has not started")):
        sp = sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        sp.add_argument("job_id", type=int, help="job id")
        _client_flags(sp)
    retry = sub.add_parser("retry", help="send dead letters back to the queue",
                           description="Send a dead job (by id), a dead event, or every dead letter back.")
    which = retry.add_mutually_exclusive_group(required=True)
    which.add_argument("job_id", type=int, nargs="?", help="job id")
    which.add_argument("--all", action="store_true", help="every dead job and dead event")
    which.add_argument("--event", metavar="EVENT_ID", help="a dead event")
    _client_flags(retry)
    dead = sub.add_parser("dead", help="list dead letters", description="List dead jobs and dead events.")
    dead.add_argument("--limit", type=int, default=50, help="at most this many of each (default: 50)")
    _client_flags(dead)
    purge = sub.add_parser("purge", help="delete old finished jobs",
                           description="Delete jobs in a final state that finished long enough ago.")
    kind = purge.add_mutually_exclusive_group(required=True)
    kind.add_argument("--dead", dest="state", action="store_const", const="dead", help="dead letters")
    kind.add_argument("--succeeded", dest="state", action="store_const", const="succeeded")
    kind.add_argument("--cancelled", dest="state", action="store_const", const="cancelled")
    purge.add_argument("--older-than", type=duration, required=True, help="e.g. 7d, 12h, 3600")
    _client_flags(purge)
    resume = sub.add_parser("resume", help="resume a paused key or function",
                            description="Lift the pause put on a key (or function) after repeated failures.")
    resume.add_argument("key", nargs="?", help="the serial key")
    resume.add_argument("--func", help="module:function instead of a key")
    _client_flags(resume)

    stats = sub.add_parser("stats", help="counts by state, workers, scheduler",
                           description="Show the daemon's counts by state, workers and scheduler.")
    _client_flags(stats)
    crons = sub.add_parser("crons", help="list recurring jobs", description="List recurring jobs.")
    _client_flags(crons)
    # Parsed by queickd.attendance.cli (main() hands it over); listed here for --help.
    sub.add_parser("attendance", help="the NFC attendance terminal ('queick attendance --help')", add_help=False)
    return p


def _fmt_time(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _print_jobs(jobs: list[dict[str, Any]]) -> None:
    print(f"{'ID':>8}  {'STATE':<15} {'TRIES':>5}  {'RUN AT':<19}  FUNC / ERROR")
    for j in jobs:
        err = j.get("error") or {}
        tail = f"  [{err.get('type')}: {err.get('message')}]" if err else ""
        tries = f"{j['attempts']}/{j['max_attempts']}"
        print(f"{j['id']:>8}  {j['state']:<15} {tries:>5}  {_fmt_time(j['run_at']):<19}  {j['func']}{tail}")


def _print_pauses(pauses: list[dict[str, Any]]) -> None:
    for p in pauses:
        err = p.get("last_error") or {}
        print(f"PAUSED {p['kind']} {p['name']} since {_fmt_time(p['paused_at'])} after {p['failures']} "
              f"failures: {err.get('type')}: {err.get('message')}  ('queick resume')")


def _print_job(job: dict[str, Any]) -> None:
    for k, v in job.items():
        if k == "error" and v:
            print(f"{'error':>16}: {v.get('type')}: {v.get('message')}")
            if v.get("traceback"):
                print("\n".join("                  " + line for line in v["traceback"].splitlines()))
        elif k in ("run_at", "created_at", "started_at", "finished_at"):
            print(f"{k:>16}: {_fmt_time(v)}")
        else:
            print(f"{k:>16}: {json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v}")


def _print_stats(s: dict[str, Any]) -> None:
    print(f"queickd {s['version']}  store {s['store']}  up {s['uptime']:.0f} s")
    w = s["workers"]
    print(f"workers: {w['busy']}/{w['total']} busy   enqueued {s['enqueued']} in {s['commits']} commits"
          f"   completed {s['completed']}   failed attempts {s['failed']}")
    sch = s["scheduler"]
    print(f"scheduler: {'alive' if sch['alive'] else 'STOPPED'}, last fired {_fmt_time(sch['last_fired_at'])}"
          f"   crons: {s['crons']}")
    net = s.get("network")
    if net is None:
        print("network: no checker configured")
    else:
        print(f"network: {net['state']} since {_fmt_time(net['since'])}   checker "
              f"{'alive' if net['checker_alive'] else 'DEAD'} (pid {net['checker_pid']}, "
              f"{net['restarts']} restarts), probing {net['target']}")
    print("jobs: " + "  ".join(f"{k} {v}" for k, v in s["counts"].items()))
    ev = s["events"]
    print(f"events: pending {ev['pending']}  dead {ev['dead']}   refused requests {s['refused']}"
          f"   cron ticks folded {s['crons_folded']}")
    for k in s["waiting_by_key"]:
        print(f"  key {k['key']}: {k['waiting']} waiting, oldest due {_fmt_time(k['oldest_run_at'])}")
    _print_pauses(s["paused"])


def _client(a: argparse.Namespace) -> JobQueue:
    token = None
    if a.token_file:
        with open(a.token_file, encoding="utf-8") as f:
            token = f.read().strip()
    return JobQueue(a.host, a.port, token=token)


def _run_client(a: argparse.Namespace) -> int:
    out: Any
    with _client(a) as q:
        if a.command == "enqueue":
            options: dict[str, Any] = {"kwargs": a.kwargs, "delay": a.delay, "run_at": a.run_at,
                                       "key": a.key, "idempotency_key": a.idempotency_key,
                                       "manual": a.manual}
            if a.retry:
                options.update(retry=True, retry_type=a.retry, max_attempts=a.max_attempts)
            job_id = q.enqueue(a.func, a.args, **options)
            if a.wait is None:
                out = {"job_id": job_id}
                print(json.dumps(out) if a.json else job_id)
                return 0
            job = q.wait(job_id, a.wait)
            print(json.dumps(job)) if a.json else _print_job(job)
            return 0 if job["state"] == State.SUCCEEDED else 1
        if a.command == "jobs":
            out = q.jobs(a.state, a.limit)
            if a.json:
                print(json.dumps(out))
            else:
                _print_pauses(q.stats()["paused"])
                _print_jobs(out)
        elif a.command in ("show", "cancel"):
            out = {"show": q.get, "cancel": q.cancel}[a.command](a.job_id)
            print(json.dumps(out)) if a.json else _print_job(out)
        elif a.command == "retry":
            if a.all:
                n = q.retry_all()
                print(json.dumps({"retried": n}) if a.json else f"{n} dead letter(s) sent back")
            elif a.event:
                out = q.retry_event(a.event)
                print(json.dumps(out) if a.json else f"event {a.event} is {out['state']} again")
            else:
                out = q.retry(a.job_id)
                print(json.dumps(out)) if a.json else _print_job(out)
        elif a.command == "dead":
            out = q.dead(a.limit)
            if a.json:
                print(json.dumps(out))
            else:
                _print_jobs(out["jobs"])
                for e in out["events"]:
                    print(f"event {e['event_id']}  {e['func']}  tries {e['attempts']}  [{e['last_error']}]")
        elif a.command == "purge":
            n = q.purge(a.older_than, a.state)
            print(json.dumps({"purged": n}) if a.json else f"{n} {a.state} job(s) purged")
        elif a.command == "resume":
            if (a.key is None) == (a.func is None):
                print("queick resume: give a KEY or --func", file=sys.stderr)
                return 2
            q.resume(a.key, func=a.func)
            print(json.dumps({"resumed": a.key or a.func}) if a.json else f"resumed {a.key or a.func}")
        elif a.command == "stats":
            out = q.stats()
            print(json.dumps(out)) if a.json else _print_stats(out)
        elif a.command == "crons":
            out = q.crons()
            if a.json:
                print(json.dumps(out))
            for c in [] if a.json else out:
                print(f"{c['name']}: {c['schedule']}  next {_fmt_time(c['next_run_at'])}"
                      f"  last {_fmt_time(c['last_fired_at'])}  folded {c['folded']}")
    return 0


def _run_daemon(a: argparse.Namespace) -> int:
    log.setup(a.log_level)
    fields = {f.name for f in dataclasses.fields(Config)}
    config = Config(**{k: v for k, v in vars(a).items() if k in fields and v is not None})
    try:
        daemon = Daemon(config)
        finished = daemon.run_forever()
    except ValueError as e:
        print(f"queick: configuration error: {e}", file=sys.stderr)
        return EX_CONFIG
    except OSError as e:  # the port is taken, the store's directory is not writable, ...
        print(f"queick: cannot start: {e}", file=sys.stderr)
        return 1
    if not finished:
        # Worker threads cannot be interrupted; the store is consistent and their jobs are
        # recovered as orphans next time, so leave without waiting for them.
        sys.stderr.flush()
        os._exit(0)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["attendance"]:
        from .attendance.cli import main as attendance_main  # no extras needed to import it
        return attendance_main(args[1:])
    if not args or (args[0] not in _SUBCOMMANDS and args[0] not in ("-h", "--help", "--version")):
        args.insert(0, "run")
    a = build_parser().parse_args(args)
    if a.command == "run":
        return _run_daemon(a)
    try:
        return _run_client(a)
    except BrokenPipeError:  # `queick jobs | head`: the reader has gone; so do we, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except QueueError as e:
        print(f"queick: {e}", file=sys.stderr)
        return 1
    except (ConnectionError, TimeoutError, OSError) as e:
        print(f"queick: {e}", file=sys.stderr)
        return 1
