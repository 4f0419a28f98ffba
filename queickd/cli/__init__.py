"""`queick`: run the daemon (the default, as Queick did) or talk to a running one.

Every flag can also come from the environment: --some-flag reads QUEICKD_SOME_FLAG.
Exit status: 0 success; 1 the daemon refused or could not be reached; 2 bad usage;
78 (EX_CONFIG) a configuration error at start-up, which systemd should not restart;
79 (EX_VERSION) this queickd's version differs from the shared database's: not restarted either.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .. import __version__, log
from .. import config as config_file
from ..api.httpd import DEFAULT_HTTP_PORT
from ..client import JobQueue
from ..core.job import State
from ..core.protocol import QueueError
from ..core.retry import POLICIES
from ..daemon import Config, Daemon
from ..services.fleet import EX_VERSION, unserved
from ..store.pgschema import VersionMismatchError
from ..ui import statusview

EX_CONFIG = 78
_DEFAULTS = Config()
_SUBCOMMANDS = ("run", "enqueue", "jobs", "show", "cancel", "retry", "stats", "crons", "dead", "purge",
                "resume", "status", "top", "worker", "db", "pool")
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


class _Repeatable(argparse.Action):
    """A repeatable flag (--pool a --pool b). Values given on the command line replace the
    default from the environment or the config file, as any other flag's do, instead of
    being added to it (argparse's own append would add them)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        items = getattr(namespace, self.dest, None)
        items = [] if items is None or items is self.default else items
        setattr(namespace, self.dest, [*items, values])


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
    if kw.get("action") == "append":
        kw["action"] = _Repeatable
    p.add_argument(flag, default=value, type=type, help=f"{help}{shown} [env {envname}]", **kw)


def _daemon_flags(p: argparse.ArgumentParser) -> None:
    d = _DEFAULTS
    _opt(p, "--store", "store URL: sqlite:///path.db, memory://, postgresql://user@host/db", d.store)
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
    _opt(p, "--http", "serve webhooks, /metrics, /healthz and the status page on HOST:PORT "
         f"(off by default; --http alone means 127.0.0.1:{DEFAULT_HTTP_PORT})", None, nargs="?",
         const=f"127.0.0.1:{DEFAULT_HTTP_PORT}")
    _opt(p, "--accept-queick-clients", "also accept unmodified Queick 1.2.1 clients (pickled "
         "requests, loaded as plain data only) on the TCP port", False, type=_truthy, nargs="?", const=True)
    _opt(p, "--pool", "worker pool this daemon's workers serve (repeatable; "
         "default: default)", None, action="append")
    _opt(p, "--heartbeat", "seconds between heartbeats in a shared PostgreSQL store (gone after 3 missed)",
         d.heartbeat, type=float)
    _opt(p, "--log-level", "log level", "info", choices=log.LEVELS)
    _opt(p, "--config", "TOML file holding any of these flags (env and command line win over it) "
         "and [hooks.NAME] webhook tables", None)


def _truthy(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def _with_config_file(p: argparse.ArgumentParser, args: list[str], a: argparse.Namespace) -> argparse.Namespace:
    """Parse again with the config file's settings as defaults (below env and flags)."""
    run = next(act for act in p._subparsers._group_actions if act.dest == "command").choices["run"]  # type: ignore[union-attr]
    dests = {act.dest: act for act in run._actions}
    values = config_file.load(a.config, dests)
    defaults: dict[str, Any] = {}
    for name, v in values.items():
        if name == "hooks":
            defaults[name] = v
            continue
        act = dests[name]
        if _env(act.option_strings[0]) is not None:
            continue  # the environment wins over the file
        if isinstance(act, _Repeatable) and not isinstance(v, list):
            v = [v]  # pool = "gpu" means the one pool, as pool = ["gpu"] does
        if isinstance(v, list):
            v = [str(x) for x in v]
        elif not isinstance(v, str):
            v = str(v).lower() if isinstance(v, bool) else str(v)  # typed by the flag's own parser
        if act.type is not None and isinstance(v, str):
            try:
                v = act.type(v)
            except (ValueError, argparse.ArgumentTypeError) as e:
                raise config_file.ConfigFileError(f"{a.config}: {name}: {e}") from None
        if act.choices is not None and v not in act.choices:
            raise config_file.ConfigFileError(f"{a.config}: {name} must be one of {', '.join(act.choices)}")
        defaults[name] = v
    run.set_defaults(**defaults)
    return p.parse_args(args)


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
    enq.add_argument("--pool", help="worker pool that runs it (default: default)")
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
    status = sub.add_parser("status", help="what the daemon is doing, at a glance",
                            description="Workers, waiting jobs per key, the oldest wait, pauses, running "
                            "jobs, dead letters with their errors, the network, and the last hour.")
    _client_flags(status)
    top = sub.add_parser("top", help="a live view of 'queick status', redrawn every second",
                         description="Redraw the status every second until q or Ctrl-C.")
    _client_flags(top)
    _fleet_parsers(sub)
    # Parsed by queickd.attendance.cli (main() hands it over); listed here for --help.
    sub.add_parser("attendance", help="the NFC attendance terminal ('queick attendance --help')", add_help=False)
    return p


def _fleet_parsers(sub: Any) -> None:
    """`queick worker`, `queick db migrate`, `queick pool set`: scaling out on PostgreSQL."""
    from ..services.workerproc import WorkerConfig

    w = WorkerConfig()
    wk = sub.add_parser(
        "worker", help="run an external worker that pulls jobs from PostgreSQL",
        description="Run jobs of the given pools from a shared PostgreSQL store. Opens no port. "
        f"Exits {EX_VERSION} (not restarted by systemd) if the database is at another queickd version.")
    _opt(wk, "--store", "the shared store: postgresql://user@host/db", None, required=_env("--store") is None)
    _opt(wk, "--pool", "worker pool to serve (repeatable; default: default)", None, action="append")
    _opt(wk, "--workers", "jobs run at once by this process", w.workers, type=int)
    _opt(wk, "--app-dir", "directory whose modules may run as jobs", w.app_dir)
    _opt(wk, "--allow", "also allow modules matching this pattern (fnmatch, repeatable)", None, action="append")
    _opt(wk, "--heartbeat", "seconds between heartbeats; gone after 3 missed", w.heartbeat, type=float)
    _opt(wk, "--sweep", "seconds between safety sweeps when no notification comes", w.sweep, type=float)
    _opt(wk, "--max-orphan-requeues", "times a job whose worker died is re-queued before it is dead",
         w.max_orphan_requeues, type=int)
    _opt(wk, "--stop-timeout", "seconds running jobs get to finish on SIGTERM", w.stop_timeout, type=float)
    _opt(wk, "--pause-after", "failed runs in a row that pause a key or function", w.pause_after, type=int)
    _opt(wk, "--log-level", "log level", "info", choices=log.LEVELS)

    db = sub.add_parser("db", help="database maintenance", description="Database maintenance.")
    dbsub = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    mig = dbsub.add_parser("migrate", help="create or upgrade the store's schema (idempotent)",
                           description="Create or upgrade the schema of the store (the daemon does this "
                           "at start too). Safe to run again, and from several hosts at once.")
    _opt(mig, "--store", "store URL", _DEFAULTS.store)

    pool = sub.add_parser("pool", help="move work between worker pools",
                          description="Operator actions on worker pools (logged by the daemon).")
    poolsub = pool.add_subparsers(dest="pool_command", metavar="ACTION", required=True)
    ps = poolsub.add_parser("set", help="move a key's waiting jobs (or a job, or a cron) to a pool",
                            description="Move the waiting jobs of KEY (or one waiting job, or a cron and "
                            "its waiting runs) to POOL. Running jobs finish where they are.")
    ps.add_argument("key", nargs="?", help="the serial key")
    ps.add_argument("pool", help="the pool to move to")
    which = ps.add_mutually_exclusive_group()
    which.add_argument("--job", type=int, metavar="JOB_ID", help="one waiting job instead of a key")
    which.add_argument("--cron", metavar="NAME", help="a cron instead of a key")
    _client_flags(ps)


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
    for name, p in (s.get("pools") or {}).items():
        alarm = "   NO WORKERS: its jobs wait" if unserved(p) else ""
        print(f"pool {name}: {p['waiting']} waiting, {p['workers']} worker slot(s) alive{alarm}")
    for w in s.get("fleet") or []:
        state = "REFUSED: " + w["refused"] if w["refused"] else "alive" if w["alive"] else "GONE"
        print(f"  {w['kind']} {w['host']}:{w['pid']} pools {','.join(w['pools'])} queickd {w['version']}"
              f"  running {w['running']}/{w['slots']}  last beat {w['silent_for']:.0f} s ago  {state}")


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
                                       "manual": a.manual, "pool": a.pool}
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
        elif a.command == "pool":
            if (a.key is None) == (a.job is None and a.cron is None):
                print("queick: give a KEY, or --job ID, or --cron NAME, and the POOL", file=sys.stderr)
                return 2
            n = q.set_pool(a.pool, key=a.key, job_id=a.job, cron=a.cron)
            print(json.dumps({"moved": n}) if a.json else f"{n} moved to pool {a.pool}")
        elif a.command == "stats":
            out = q.stats()
            print(json.dumps(out)) if a.json else _print_stats(out)
        elif a.command == "status":
            out = q.stats(detail=True)
            print(json.dumps(out) if a.json else "\n".join(statusview.lines(out, 200)))
        elif a.command == "top":
            return statusview.top(lambda: q.stats(detail=True))
        elif a.command == "crons":
            out = q.crons()
            if a.json:
                print(json.dumps(out))
            for c in [] if a.json else out:
                print(f"{c['name']}: {c['schedule']}  next {_fmt_time(c['next_run_at'])}"
                      f"  last {_fmt_time(c['last_fired_at'])}  folded {c['folded']}")
    return 0


_C = TypeVar("_C")


def _given(config_class: type[_C], a: argparse.Namespace) -> _C:
    """A config dataclass from the options given (those left at None keep its defaults)."""
    fields = {f.name for f in dataclasses.fields(config_class)}  # type: ignore[arg-type]
    return config_class(**{k: v for k, v in vars(a).items() if k in fields and v is not None})


def _run_daemon(a: argparse.Namespace) -> int:
    log.setup(a.log_level)
    config = _given(Config, a)
    try:
        daemon = Daemon(config)
        finished = daemon.run_forever()
    except ValueError as e:
        print(f"queick: configuration error: {e}", file=sys.stderr)
        return EX_CONFIG
    except VersionMismatchError as e:
        print(f"queick: {e}", file=sys.stderr)
        return EX_VERSION
    except OSError as e:  # the port is taken, the store's directory is not writable, ...
        print(f"queick: cannot start: {e}", file=sys.stderr)
        return 1
    if not finished:
        # Worker threads cannot be interrupted; the store is consistent and their jobs are
        # recovered as orphans next time, so leave without waiting for them.
        sys.stderr.flush()
        os._exit(daemon.exit_status)
    return daemon.exit_status


def _run_worker(a: argparse.Namespace) -> int:
    from ..services.workerproc import WorkerConfig, run

    log.setup(a.log_level)
    config = _given(WorkerConfig, a)
    try:
        return run(config)
    except ValueError as e:
        print(f"queick: configuration error: {e}", file=sys.stderr)
        return EX_CONFIG
    except OSError as e:  # the database cannot be reached: systemd tries again later
        print(f"queick: cannot start: {e}", file=sys.stderr)
        return 1


def _run_db(a: argparse.Namespace) -> int:
    from ..store import open_store
    from ..store.base import FleetStore

    try:
        store = open_store(a.store)  # opening migrates
    except VersionMismatchError as e:
        print(f"queick: {e}", file=sys.stderr)
        return EX_VERSION
    except ValueError as e:
        print(f"queick: {e}", file=sys.stderr)
        return EX_CONFIG
    except OSError as e:
        print(f"queick: cannot migrate: {e}", file=sys.stderr)
        return 1
    v = store.versions() if isinstance(store, FleetStore) else None  # only a shared store records them
    shown = f" (queickd {v[0]}, schema {v[1]})" if v else ""
    store.close()
    print(f"{a.store}: schema up to date{shown}")
    return 0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line (with no command, `run`), and for `run` the --config file beneath it.
    Raises config.ConfigFileError for a bad file; exits (2) on bad usage, as argparse does."""
    args = list(argv)
    if not args or (args[0] not in _SUBCOMMANDS and args[0] not in ("-h", "--help", "--version")):
        args.insert(0, "run")
    p = build_parser()
    a = p.parse_args(args)
    if a.command == "run" and a.config:
        a = _with_config_file(p, args, a)
    return a


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["attendance"]:
        from ..attendance.cli import main as attendance_main
        return attendance_main(args[1:])
    try:
        a = parse_args(args)
    except config_file.ConfigFileError as e:
        print(f"queick: configuration error: {e}", file=sys.stderr)
        return EX_CONFIG
    if a.command == "run":
        return _run_daemon(a)
    if a.command == "worker":
        return _run_worker(a)
    if a.command == "db":
        return _run_db(a)
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
