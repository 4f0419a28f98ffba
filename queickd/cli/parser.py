"""The `queick` command line: one sub-parser per command, each naming the function that runs
it (`set_defaults(handler=...)`), and the `--config` file read beneath `queick run`. Only parses;
never runs a command."""

from __future__ import annotations

import argparse
import difflib
import functools
from collections.abc import Collection, Sequence
from typing import Any

from .. import __version__, log
from .. import config as config_file
from ..core import sandbox
from ..core.job import State
from ..core.policy import liveness
from ..core.retry import POLICIES
from ..settings import EX_VERSION
from . import dbparser, ops, queickflags, runflags
from . import jobs as jobs_cmd
from .options import (
    DEFAULTS,
    BadEnvironmentError,
    Repeatable,
    duration,
    env,
    env_name,
    json_arg,
    number,
    opt,
)
from .remote import ClientCommand, run_client

SUBCOMMANDS = ("run", "enqueue", "jobs", "show", "cancel", "retry", "stats", "crons", "cron", "dead", "purge",
               "resume", "pause", "drain", "status", "top", "worker", "db", "pool", "budgets", "workflows",
               "workflow")
STARTS_A_PROCESS = ("run", "worker")  # their bad QUEICKD_* values exit 78, not 2


def _talks(p: argparse.ArgumentParser, command: ClientCommand) -> None:
    """Give `p` the client flags and make it run `command` against the daemon."""
    _client_flags(p)
    p.set_defaults(handler=functools.partial(run_client, command))


def _command(p: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of the command `name` (its flags and their defaults)."""
    return next(act for act in p._subparsers._group_actions if act.dest == "command").choices[name]  # type: ignore[union-attr]


def _with_config_file(p: argparse.ArgumentParser, args: list[str], a: argparse.Namespace) -> argparse.Namespace:
    """Parse again with the config file's settings as defaults (below env and flags)."""
    run = _command(p, "run")
    dests = {act.dest: act for act in run._actions}
    values = config_file.load(a.config, dests)
    defaults: dict[str, Any] = {}
    for name, v in values.items():
        if name in config_file.TABLES:
            defaults[name] = v
            continue
        act = dests[name]
        if env(act.option_strings[0]) is not None:
            continue  # the environment wins over the file
        if isinstance(act, Repeatable) and not isinstance(v, list):
            v = [v]  # pool = "gpu" means the one pool, as pool = ["gpu"] does
        if act.type is str and not all(isinstance(x, str) for x in (v if isinstance(v, list) else [v])):
            raise config_file.ConfigFileError(f"{a.config}: {name} must be a string"
                                              + (" or a list of strings" if isinstance(act, Repeatable) else "")
                                              + f", not {v!r}")
        if isinstance(v, list) and not isinstance(act, Repeatable):
            raise config_file.ConfigFileError(f"{a.config}: {name} must be one value, not a list")
        if not isinstance(v, str | list):  # a list's items are strings: checked above
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
    ns = p.parse_args(args)
    ns.in_file = frozenset(defaults) - frozenset(config_file.TABLES)  # the settings the file gave
    return ns


def _origins(command: argparse.ArgumentParser, args: Sequence[str], config: str | None,
             in_file: Collection[str]) -> dict[str, str]:
    """Where each setting of a command that starts a process came from, for those not left
    at their defaults: its flag, its QUEICKD_* variable or the config file, in the order
    they win. A configuration error names them (cli/run.py: configuration_error)."""
    longs = {a.dest: [o for o in a.option_strings if o.startswith("--")] for a in command._actions}
    every = {o for opts in longs.values() for o in opts}
    typed = {tok.split("=", 1)[0] for tok in args if tok.startswith("--")}
    out: dict[str, str] = {}
    for dest, opts in longs.items():
        if not opts or dest in ("help", "config"):
            continue
        # argparse takes a unique prefix of a long flag for the flag (--work for --workers)
        if any(o == t or (t not in every and o.startswith(t)) for o in opts for t in typed):
            out[dest] = f"the flag {opts[0]}"
        elif env(opts[0]) is not None:
            out[dest] = env_name(opts[0])
        elif dest in in_file:
            out[dest] = str(config)
    return out


def _client_flags(p: argparse.ArgumentParser) -> None:
    opt(p, "--host", "daemon host", "127.0.0.1")
    opt(p, "--port", "daemon port", DEFAULTS.port, type=int)
    opt(p, "--token-file", "file holding the daemon's token (or name:token)", None)
    opt(p, "--tls-ca", "connect over TLS, trusting the daemon's certificate if this PEM CA signed it", None)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def _filter_flags(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--func", help=f"{what} of this module:function")
    p.add_argument("--key", help=f"{what} of this serial key")
    p.add_argument("--pool", help=f"{what} of this worker pool")


def _local(name: str) -> Any:
    """The handler `name` of cli/run.py (the daemon, the worker, the db commands), imported
    when it runs: those load the daemon's modules, which a client command never needs
    (it starts faster without them)."""

    def handler(a: argparse.Namespace) -> int:
        from . import run as run_cmd

        return getattr(run_cmd, name)(a)

    handler.__name__ = name
    return handler


# Where to read more, as `queick --help` ends: the pages as they exist in the source tree,
# and where scripts/install-pi.sh installs them (the units' Documentation= is among them).
DOCS = ("Documentation: docs/index.md in the source tree ('mkdocs serve' makes it a site); "
        "installed by scripts/install-pi.sh in /usr/share/doc/queickd/.")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="queick",
        description="queickd: a durable job-queue daemon for edge devices. With no command, "
        "runs the daemon (same as 'queick run').",
        epilog=f"Run 'queick COMMAND --help' for a command's flags. {DOCS}",
    )
    p.add_argument("--version", action="version", version=f"queickd {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="run the daemon (the default)",
                         description="Run the daemon in the foreground until SIGTERM/SIGINT.")
    runflags.daemon_flags(run)
    queickflags.add(run)
    run.set_defaults(handler=_local("run_daemon"))

    enq = sub.add_parser("enqueue", help="queue a job", description="Queue one job and print its id.")
    enq.add_argument("func", help="module:function to run (module.function works too)")
    enq.add_argument("--args", type=json_arg(list), default=[], help="positional arguments, a JSON array")
    enq.add_argument("--kwargs", type=json_arg(dict), default={}, help="keyword arguments, a JSON object")
    when = enq.add_mutually_exclusive_group()
    when.add_argument("--delay", type=number, help="run after this many seconds")
    when.add_argument("--run-at", type=number, help="run at this unix time")
    enq.add_argument("--priority", type=int, default=0, help="lower runs first (default: 0)")
    enq.add_argument("--retry", choices=POLICIES, help="retry on failure with this backoff policy")
    enq.add_argument("--max-attempts", type=int, help="runs in all, the first included (with --retry)")
    enq.add_argument("--key", help="serial key")
    enq.add_argument("--idempotency-key", help="a second enqueue with this key returns the first job")
    enq.add_argument("--pool", help="worker pool that runs it (default: default)")
    enq.add_argument("--concurrency-group", help="at most --concurrency-limit jobs of this group run at once")
    enq.add_argument("--concurrency-limit", type=int, help="the group's limit (with --concurrency-group)")
    enq.add_argument("--cost-units", type=number, help="what it takes of its pool's and group's budgets "
                     "(default: 1)")
    enq.add_argument("--rate-limit", nargs=3, metavar=("KEY", "LIMIT", "PER"),
                     help="start at most LIMIT jobs of rate key KEY in any PER seconds (e.g. slack:#general 1 1)")
    enq.add_argument("--fair-by", help="its fair key (a tenant): its pool's claims take turns across fair keys")
    enq.add_argument("--manual", action="store_true",
                     help="an operator's run: refused (conflict) if its key already has a job; resumes a pause")
    enq.add_argument("--isolation", choices=sandbox.ISOLATIONS, help="run it in a thread or a process")
    enq.add_argument("--timeout", type=duration, help="seconds of wall time (runs it in a process)")
    enq.add_argument("--memory-mb", type=int, help="peak resident memory (runs it in a process)")
    enq.add_argument("--output-kb", type=int, help="stdout+stderr and result kept (runs it in a process)")
    enq.add_argument("--stalled-after", type=duration, help="seconds without progress (a process job: nor "
                     "CPU time) after which the running job is stalled")
    enq.add_argument("--on-stall", choices=liveness.ON_STALL,
                     help="what a stalled job gets: mark (the default: shown as stalled) or kill (stopped, "
                     "retried per its policy)")
    enq.add_argument("--wait", type=number, metavar="SECONDS", help="wait for the job to finish and print its result (JSON; --json: the whole job); "
                     "exit 1 if it did not succeed")
    _talks(enq, jobs_cmd.enqueue)

    jobs = sub.add_parser("jobs", help="list jobs, newest first", description="List jobs, newest first.")
    jobs.add_argument("--state", choices=State.ALL, help="only jobs in this state")
    jobs.add_argument("--limit", type=int, default=50, help="at most this many (default: 50)")
    _filter_flags(jobs, "only jobs")
    _talks(jobs, jobs_cmd.jobs)

    show = sub.add_parser("show", help="show one job in full", description="Show one job in full.")
    show.add_argument("job_id", type=int, help="job id")
    _talks(show, jobs_cmd.show)
    cancel = sub.add_parser(
        "cancel", help="cancel a job (waiting or running), or every waiting job matching filters",
        description="Cancel one job: a waiting one never starts; a running one is cancelled at once and "
        "the outcome of its run is discarded (a job run in a thread runs on to its end; one run in a "
        "process is killed). Or, with --state, every job in that waiting state matching --func, --key "
        "and --pool: without --yes it only counts them.")
    cancel.add_argument("job_id", type=int, nargs="?", help="job id")
    cancel.add_argument("--state", choices=State.PENDING, help="cancel every job in this waiting state")
    _filter_flags(cancel, "with --state: only jobs")
    cancel.add_argument("--yes", action="store_true", help="with --state: cancel them (without it: count only)")
    _talks(cancel, jobs_cmd.cancel)
    retry = sub.add_parser("retry", help="send dead letters back to the queue",
                           description="Send a dead job (by id), a dead event, or every dead letter back.")
    which = retry.add_mutually_exclusive_group(required=True)
    which.add_argument("job_id", type=int, nargs="?", help="job id")
    which.add_argument("--all", action="store_true", help="every dead job and dead event")
    which.add_argument("--event", metavar="EVENT_ID", help="a dead event")
    _talks(retry, jobs_cmd.retry)
    dead = sub.add_parser("dead", help="list dead letters", description="List dead jobs and dead events.")
    dead.add_argument("--limit", type=int, default=50, help="at most this many of each (default: 50)")
    _talks(dead, jobs_cmd.dead)
    purge = sub.add_parser("purge", help="delete old finished jobs",
                           description="Delete jobs in a final state that finished long enough ago.")
    kind = purge.add_mutually_exclusive_group(required=True)
    kind.add_argument("--dead", dest="state", action="store_const", const="dead", help="dead letters")
    kind.add_argument("--succeeded", dest="state", action="store_const", const="succeeded",
                      help="succeeded jobs")
    kind.add_argument("--cancelled", dest="state", action="store_const", const="cancelled",
                      help="cancelled jobs")
    purge.add_argument("--older-than", type=duration, required=True, help="e.g. 7d, 12h, 3600")
    _talks(purge, jobs_cmd.purge)
    for name, text, description, command in (
            ("resume", "resume a paused key, function or pool",
             "Lift the pause of a key (or function, or pool): one put on after repeated failures, or by "
             "'queick pause'.", jobs_cmd.resume),
            ("pause", "pause a key, function or pool by hand, until 'queick resume'",
             "Pause a key (or function, or pool): its jobs wait, running ones finish. The same pause as "
             "after repeated failures, but with no probe: it lasts until 'queick resume'.", jobs_cmd.pause)):
        sp = sub.add_parser(name, help=text, description=description)
        sp.add_argument("key", nargs="?", help="the serial key")
        sp.add_argument("--func", help="module:function instead of a key")
        sp.add_argument("--pool", help="a worker pool instead of a key")
        _talks(sp, command)
    drain = sub.add_parser("drain", help="stop starting jobs, let running ones finish, report when idle",
                           description="For maintenance: this daemon starts no new job (they keep "
                           "waiting, and are accepted as usual); waits for its running jobs and says "
                           "when it is idle. Lasts until 'queick drain --off' or a restart.")
    drain.add_argument("--off", action="store_true", help="end the drain: start jobs again")
    drain.add_argument("--timeout", type=duration, default=600.0,
                       help="how long to wait for running jobs (e.g. 90, 15m; default: 10m); exit 1 if "
                       "still busy")
    _talks(drain, ops.drain)

    stats = sub.add_parser("stats", help="counts by state, workers, scheduler",
                           description="Show the daemon's counts by state, workers and scheduler.")
    _talks(stats, ops.stats)
    budgets = sub.add_parser("budgets", help="cost budgets: limit, running, waiting",
                             description="Each cost budget in force ([budgets.pools], [budgets.groups]; on "
                             "PostgreSQL the database's, whoever set them): its limit, the cost units running "
                             "against it and those waiting for it.")
    _talks(budgets, ops.budgets)
    crons = sub.add_parser("crons", help="list recurring jobs", description="List recurring jobs.")
    _talks(crons, ops.crons)
    cron = sub.add_parser("cron", help="manage a recurring job ('queick cron delete NAME')",
                          description="Manage recurring jobs (see 'queick crons' for their names).")
    cronsub = cron.add_subparsers(dest="cron_command", metavar="ACTION", required=True)
    cdel = cronsub.add_parser("delete", help="delete a recurring job by name (runs already queued stay)",
                              description="Delete the recurring job NAME: it fires no more. Runs it has "
                              "already queued stay queued.")
    cdel.add_argument("name", help="the cron's name")
    _talks(cdel, ops.cron_delete)
    status = sub.add_parser("status", help="what the daemon is doing, at a glance",
                            description="Workers, waiting jobs per key, the oldest wait, pauses, running "
                            "jobs, dead letters with their errors, the network, and the last hour.")
    _talks(status, ops.status)
    top = sub.add_parser("top", help="a live view of 'queick status', redrawn every second",
                         description="Redraw the status every second until q or Ctrl-C.")
    _client_flags(top)
    top.set_defaults(handler=ops.top)  # it checks for a terminal before it connects
    _fleet_parsers(sub)
    _workflow_parsers(sub)
    # Parsed by queickd.attendance.cli (main() hands it over); listed here for --help.
    sub.add_parser("attendance", help="the NFC attendance terminal ('queick attendance --help')", add_help=False)
    return p


def _workflow_parsers(sub: Any) -> None:
    """`queick workflows`, `queick workflow show|cancel|start`."""
    from ..core.workflow import RunState
    from . import workflows as wf_cmd

    runs = sub.add_parser("workflows", help="list workflow runs, newest first",
                          description="List workflow runs, newest first.")
    runs.add_argument("--state", choices=RunState.ALL, help="only runs in this state")
    runs.add_argument("--limit", type=int, default=50, help="at most this many (default: 50)")
    _talks(runs, wf_cmd.workflows)
    wf = sub.add_parser("workflow", help="show, cancel or start a workflow run",
                        description="Show, cancel or start one workflow run.")
    wfsub = wf.add_subparsers(dest="workflow_command", metavar="ACTION", required=True)
    for name, text, command in (("show", "a run's steps, jobs, state size and budget used/limit", wf_cmd.show),
                                ("cancel", "cancel a running run (its waiting jobs too)", wf_cmd.cancel)):
        sp = wfsub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        sp.add_argument("run_id", type=int, help="run id")
        _talks(sp, command)
    st = wfsub.add_parser("start", help="start a workflow declared in the daemon's config file",
                          description="Start a run of the workflow NAME ([workflows.NAME] in the daemon's config).")
    st.add_argument("name", help="the declared workflow")
    st.add_argument("--state", type=json_arg(dict), default={}, help="its initial state, a JSON object")
    st.add_argument("--idempotency-key", help="a second start with this key returns the first run")
    st.add_argument("--wait", type=number, metavar="SECONDS", help="wait for the run to end and show it")
    _talks(st, wf_cmd.start)


def _fleet_parsers(sub: Any) -> None:
    """`queick worker`, `queick db migrate`, `queick pool set`: scaling out on PostgreSQL."""
    from ..settings import WorkerConfig

    w = WorkerConfig()
    wk = sub.add_parser(
        "worker", help="run an external worker that pulls jobs from PostgreSQL",
        description="Run jobs of the given pools from a shared PostgreSQL store. Opens no port. "
        f"Exits {EX_VERSION} (not restarted by systemd) if the database is at another queickd version.")
    opt(wk, "--store", "the shared store: postgresql://user@host/db", None, required=env("--store") is None)
    opt(wk, "--pool", "worker pool to serve (repeatable; default: default)", None, action="append")
    opt(wk, "--workers", "jobs run at once by this process (a fixed size; see --min-workers)", w.workers,
        type=int)
    runflags.size_flags(wk, w.idle_grace)
    opt(wk, "--app-dir", "directory whose modules may run as jobs", w.app_dir)
    opt(wk, "--allow", "also allow modules matching this pattern (fnmatch, repeatable)", None, action="append")
    opt(wk, "--heartbeat", "seconds between heartbeats; gone after 3 missed", w.heartbeat, type=number)
    opt(wk, "--sweep", "seconds between safety sweeps when no notification comes", w.sweep, type=number)
    opt(wk, "--max-orphan-requeues", "times a job whose worker died is re-queued before it is dead",
         w.max_orphan_requeues, type=int)
    opt(wk, "--stop-timeout", "seconds running jobs get to finish on SIGTERM", w.stop_timeout, type=number)
    opt(wk, "--max-queued", "the daemons' --max-queued: a workflow's fan-out advanced here enqueues its "
        "items under it", w.max_queued, type=int)
    opt(wk, "--pause-after", "dead jobs in a row that pause a key or function (0: never)", w.pause_after, type=int)
    opt(wk, "--pause-cooldown", "wait before a pause lets one probe job through (doubles on each trip, "
         "up to 1h)", w.pause_cooldown, type=duration)
    runflags.memory_flags(wk, w.memory_reserve)
    opt(wk, "--config", "the daemons' TOML file: its [budgets.pools] and [budgets.groups], if any, "
         "become the budgets in force on the database for every claimer (replacing others, logged); "
         "its budget-patience applies to this worker's claims (its other settings are the daemon's)", None)
    runflags.sandbox_flags(wk)
    opt(wk, "--log-level", "log level", "info", choices=log.LEVELS)
    wk.add_argument("--check", action="store_true",
                    help="start nothing: exit 0 if a worker process of this host serving the --pool "
                    "given (any, without one) beats in --store, else 1 saying why (a container's healthcheck)")
    wk.set_defaults(handler=_local("run_worker"))

    dbparser.add_db_parsers(sub, _local)

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
    _talks(ps, jobs_cmd.pool_set)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line (with no command, `run`), and for `run` the --config file beneath it.
    Raises config.ConfigFileError for a bad file, and for a bad QUEICKD_* value given to a
    command that starts a process; exits (2) on bad usage, as argparse does."""
    args = list(argv)
    unknown = args[0] if args and not args[0].startswith("-") and args[0] not in SUBCOMMANDS else None
    if not args or (args[0] not in SUBCOMMANDS and args[0] not in ("-h", "--help", "--version")):
        args.insert(0, "run")
    try:
        p = build_parser()
    except BadEnvironmentError as e:
        if args[0] in STARTS_A_PROCESS:
            raise config_file.ConfigFileError(e.message) from None
        e.parser.error(e.message)
    if unknown is not None:  # a mistyped command, not flags of the default `run`
        near = difflib.get_close_matches(unknown, (*SUBCOMMANDS, "attendance"), n=1)
        p.error(f"unknown command {unknown!r}" + (f" (did you mean {near[0]!r}?)" if near else "")
                + "; 'queick --help' lists the commands")
    a = p.parse_args(args)
    if a.command == "run" and a.config:
        a = _with_config_file(p, args, a)
    if a.command == "run":
        queickflags.apply(_command(p, "run"), a)
    if a.command in STARTS_A_PROCESS:
        a.origins = _origins(_command(p, a.command), args[1:], getattr(a, "config", None), getattr(a, "in_file", ()))
    return a


