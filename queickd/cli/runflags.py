"""The flags of the commands that run jobs (`queick run`, and in part `queick worker`): where
the daemon listens and stores, how many workers, limits, the sandbox, workflow budgets.
Only declares flags; parser.py builds the commands from them."""

from __future__ import annotations

import argparse

from .. import log
from ..core import sandbox
from ..settings import DEFAULT_ASYNC_JOBS, DEFAULT_HTTP_PORT, WORKFLOW_BUDGETS
from .options import DEFAULTS, duration, number, opt, truthy


def daemon_flags(p: argparse.ArgumentParser) -> None:
    d = DEFAULTS
    opt(p, "--store", "store URL: sqlite:///path.db, memory://, postgresql://user@host/db", d.store)
    opt(p, "--durability", "SQLite sync: full survives power loss; normal may lose the last "
         "commits on power loss (never on a crash)", d.durability, choices=("full", "normal"))
    opt(p, "--bind", "address to listen on (keep loopback unless you set --token-file)", d.bind)
    opt(p, "--port", "TCP port of the enqueue protocol (0 picks a free one)", d.port, type=int)
    opt(p, "--workers", "worker threads running jobs (a fixed size; see --min-workers)", d.workers, type=int)
    size_flags(p, d.idle_grace)
    opt(p, "--app-dir", "directory whose modules may run as jobs", d.app_dir)
    opt(p, "--allow", "also allow modules matching this pattern (fnmatch, repeatable), "
         "e.g. 'queickd.attendance.*'", None, action="append")
    opt(p, "--token-file", "file of the tokens clients must send in hello: one name:token per line (or one "
         "bare token); reloaded on SIGHUP, a removed line's connections closed", None)
    opt(p, "--tls-cert", "serve the TCP port over TLS with this PEM certificate (chain); reloaded on SIGHUP",
        None)
    opt(p, "--tls-key", "the PEM private key of --tls-cert", None)
    opt(p, "--tls-client-ca", "mutual TLS: clients must show a certificate signed by this PEM CA", None)
    opt(p, "--max-connections", "TCP connections served at once; more are told so and closed (lowered "
         "to keep file descriptors free under LimitNOFILE)", d.max_connections, type=int)
    opt(p, "--hello-timeout", "seconds a connection has to send its first line (with --token-file: "
         "to authenticate) before it is closed", d.hello_timeout, type=duration)
    opt(p, "--max-pending", "replies owed on one connection before the daemon stops reading it",
         d.max_pending, type=int)
    opt(p, "--stop-timeout", "seconds running jobs get to finish on SIGTERM", d.stop_timeout, type=number)
    opt(p, "--max-orphan-requeues", "times a job left running by a crash is re-queued before "
         "it is dead", d.max_orphan_requeues, type=int)
    opt(p, "--sweep", "seconds between safety sweeps of an idle daemon", d.sweep, type=number)
    opt(p, "--ping-host", "start the network checker: HOST[:PORT] (TCP connect, port 80) or "
         "icmp://HOST; jobs with retry_on_network wait for the network", None)
    opt(p, "--ping-interval", "seconds between network probes", d.ping_interval, type=number)
    opt(p, "--max-queued", "waiting jobs in all before enqueue answers queue_full", d.max_queued, type=int)
    opt(p, "--max-queued-per-key", "waiting jobs per key before enqueue answers queue_full",
         d.max_queued_per_key, type=int)
    opt(p, "--idempotency-ttl", "how long an idempotency key names its job (e.g. 24h)",
         d.idempotency_ttl, type=duration)
    opt(p, "--event-max-attempts", "delivery attempts of an event before it is a dead letter",
         d.event_max_attempts, type=int)
    opt(p, "--pause-after", "dead jobs in a row that pause a key or function (0: never)", d.pause_after, type=int)
    opt(p, "--pause-cooldown", "wait before a pause lets one probe job through (doubles on each trip, "
         "up to 1h)", d.pause_cooldown, type=duration)
    opt(p, "--keep-finished", "how long succeeded and cancelled jobs are kept (e.g. 7d)",
         d.keep_finished, type=duration)
    opt(p, "--http", "serve webhooks, /metrics, /healthz and the status page on HOST:PORT "
         f"(off by default; --http alone means 127.0.0.1:{DEFAULT_HTTP_PORT})", None, nargs="?",
         const=f"127.0.0.1:{DEFAULT_HTTP_PORT}")
    opt(p, "--http-token-file", "file holding a token that /, /metrics and /jobs/ID of the HTTP "
         "listener want as 'Authorization: Bearer TOKEN' (/healthz and the hooks stay open)", None)
    opt(p, "--accept-queick-clients", "also accept unmodified Queick 1.2.1 clients (pickled "
         "requests, loaded as plain data only) on the TCP port (off unless given)", False, type=truthy,
         action="switch")
    opt(p, "--pool", "worker pool this daemon's workers serve (repeatable; "
         "default: default)", None, action="append")
    opt(p, "--heartbeat", "seconds between heartbeats in a shared PostgreSQL store (gone after 3 missed)",
         d.heartbeat, type=number)
    workflow_flags(p)
    opt(p, "--budget-patience", "seconds a job over its budget waits before younger jobs of its "
         "pool or group stop starting until it has", d.budget_patience, type=duration)
    memory_flags(p, d.memory_reserve)
    sandbox_flags(p)
    opt(p, "--log-level", "log level", "info", choices=log.LEVELS)
    opt(p, "--config", "TOML file holding any of these flags (env and command line win over it), "
         "[hooks.NAME] webhook tables, [functions.\"module:func\"] job defaults and "
         "[budgets.pools] / [budgets.groups] cost budgets", None)


def workflow_flags(p: argparse.ArgumentParser) -> None:
    for k in WORKFLOW_BUDGETS:
        opt(p, f"--workflow-{k.replace('_', '-')}", f"workflow runs' {k} where their definition names none, "
            "and the most a client's definition may ask (0: no limit)", getattr(DEFAULTS, f"workflow_{k}"), type=int)


def size_flags(p: argparse.ArgumentParser, grace: float) -> None:
    opt(p, "--min-workers", "adaptive pool: workers kept running (default: --workers)", None, type=int)
    opt(p, "--max-workers", "adaptive pool: grow to this many while work waits with every worker busy "
         "(default: --workers)", None, type=int)
    opt(p, "--idle-grace", "adaptive pool: seconds of a quiet queue before it shrinks by one",
         grace, type=duration)
    opt(p, "--async-jobs", "async jobs (async def) run at once on the event loop, beside the worker "
         "threads (0: each takes a worker thread)", DEFAULT_ASYNC_JOBS, type=int)


def memory_flags(p: argparse.ArgumentParser, reserve: float) -> None:
    opt(p, "--memory-reserve", "MB of memory kept free: a job whose functions' recent runs took more "
         "than the room left waits a little (unless nothing else runs)", reserve, type=number)
    opt(p, "--max-rss", "MB this process may grow to, its jobs included (default: no cap)", None, type=number)
    p.add_argument("--memory-root", default=argparse.SUPPRESS, metavar="DIR",
                   help="the directory the memory check reads proc/ and sys/fs/cgroup/ under (default /; for tests)")


def sandbox_flags(p: argparse.ArgumentParser) -> None:
    """Where jobs run and their limits, for every job (a job's own fields win)."""
    opt(p, "--isolation", "where jobs run: thread, or process (a fresh child of the zygote)",
        DEFAULTS.isolation, choices=sandbox.ISOLATIONS)
    opt(p, "--timeout", "seconds of wall time a job may run (runs jobs in processes)", None, type=duration)
    opt(p, "--memory-mb", "peak resident memory of a job (runs jobs in processes)", None, type=int)
    opt(p, "--output-kb", "stdout+stderr (and result) a process job may write", None, type=int)
    opt(p, "--sandbox-env", "a variable passed on to process jobs by name (repeatable)", None,
        action="append")
    opt(p, "--job-namespaces", "auto: each process job in PID and mount namespaces of its own (private "
        "/tmp and /dev/shm, the store and token hidden) where the kernel allows; off: not", "auto",
        choices=("auto", "off"))
    opt(p, "--job-user", "run process jobs as this user (not the daemon's): they cannot touch its "
        "files or cgroups; needs CAP_SETUID, CAP_SETGID, CAP_CHOWN and CAP_KILL", None)
