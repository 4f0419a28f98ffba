"""The settings of the daemon (Config) and of an external worker (WorkerConfig), with
their defaults (the wire's port and line limit are the protocol's: core/protocol.py).
Light on purpose: the CLI builds its flags from these, and a client command (`queick
enqueue`, `queick jobs`) must not load the daemon to print them. The modules that use a
default import it from here; the checks, which need the daemon's parts, are
startcheck.validate's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .core import protocol, sandbox
from .core.fields import DEFAULT_POOL
from .core.workflow.model import BUDGETS as WORKFLOW_BUDGETS
from .core.workflow.model import DEFAULT_BUDGET as WORKFLOW_DEFAULTS

if TYPE_CHECKING:
    from .core.policy.admission import Admission
    from .core.policy.resources import Resources

DEFAULT_URL = "sqlite:///queickd.db"  # the store
SQLITE_PAGE = 1024  # bytes a page of a new SQLite store file (store/sqlite/connection.py: why)
SQLITE_PAGE_SIZES = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)  # those SQLite allows
DEFAULT_HOST = "127.0.0.1"  # the TCP listener's address
DEFAULT_MAX_CONNECTIONS = 256  # a Pi's worth: each costs a file descriptor and buffers
DEFAULT_HELLO_TIMEOUT = 10.0  # seconds to send a first line (to authenticate, with a token)
DEFAULT_MAX_PENDING = 256  # replies owed on one connection before reading pauses
DEFAULT_HTTP_PORT = 9998  # --http alone: 127.0.0.1 on this port
DEFAULT_WORKERS = 4
DEFAULT_ASYNC_JOBS = 100  # async jobs run at once on the event loop, besides the worker threads
DEFAULT_SWEEP = 60.0  # seconds between safety sweeps when nothing wakes the pool
DEFAULT_IDLE_GRACE = 60.0  # seconds the queue is quiet before an adaptive pool shrinks
DEFAULT_INTERVAL = 1.0  # seconds between network checks
DEFAULT_HEARTBEAT = 10.0  # seconds between heartbeats; a worker silent for 3 of them is gone
DEFAULT_RESERVE_MB = 64.0  # MB the memory-aware start keeps free
DEFAULT_STOP_TIMEOUT = 30.0  # seconds running jobs get to end on SIGTERM
DEFAULT_MAX_ORPHAN_REQUEUES = 3  # times a job whose worker vanished is run again
DEFAULT_PAUSE_AFTER = 5  # failures in a row that pause a key or function (0: never)
DEFAULT_PAUSE_COOLDOWN = 300.0  # seconds from a pause to its probe (doubling on each trip)
DEFAULT_BUDGET_PATIENCE = 30.0  # seconds a job over its budget waits before it reserves it
EX_VERSION = 79  # exit status: this worker's version differs from the database's; do not restart


@dataclass
class _RunsJobs:
    """The settings of the part that runs jobs, a daemon's and an external worker's alike."""

    store: str = ""
    pool: list[str] = field(default_factory=lambda: [DEFAULT_POOL])  # worker pools its workers serve
    workers: int = DEFAULT_WORKERS
    app_dir: str = "."
    allow: list[str] = field(default_factory=list)
    heartbeat: float = DEFAULT_HEARTBEAT  # seconds between beats in a shared (PostgreSQL) store
    sweep: float = DEFAULT_SWEEP
    max_orphan_requeues: int = DEFAULT_MAX_ORPHAN_REQUEUES
    stop_timeout: float = DEFAULT_STOP_TIMEOUT
    pause_after: int = DEFAULT_PAUSE_AFTER  # 0: no auto-pause
    pause_cooldown: float = DEFAULT_PAUSE_COOLDOWN
    memory_reserve: float = DEFAULT_RESERVE_MB  # MB kept free by the memory-aware start
    max_rss: float | None = None  # MB this process may grow to, jobs included
    memory_root: str = "/"  # where /proc and /sys/fs/cgroup are read (tests point it elsewhere)
    min_workers: int | None = None  # adaptive pool bounds (None: --workers, a fixed size)
    max_workers: int | None = None
    async_jobs: int = DEFAULT_ASYNC_JOBS  # async jobs at once on the event loop, beside the threads
    idle_grace: float = DEFAULT_IDLE_GRACE  # seconds the queue is quiet before the pool shrinks
    budgets: dict = field(default_factory=dict)  # [budgets.pools] and [budgets.groups]
    budget_patience: float = DEFAULT_BUDGET_PATIENCE
    fair_shares: dict = field(default_factory=dict)  # [fair_shares]: fair key = weight (core/policy/fair.py)
    max_queued: int = 1_000_000  # a worker's is the daemons': a paced fan-out's items wait under it there too
    isolation: str = sandbox.THREAD  # where jobs run unless they or their function say otherwise
    timeout: float | None = None  # limits for every job (each one sends jobs to processes)
    memory_mb: int | None = None
    output_kb: int | None = None
    sandbox_env: list[str] = field(default_factory=list)  # variables passed on to process jobs
    # the --config file: read at start only (SIGHUP reloads job code, not it); hidden from process jobs
    config: str | None = None
    job_namespaces: str = "auto"  # auto: PID and mount namespaces per process job where the kernel allows
    job_user: str | None = None  # the user process jobs run as (needs CAP_SETUID, CAP_SETGID, CAP_CHOWN, CAP_KILL)


@dataclass
class Config(_RunsJobs):
    """Every daemon setting with its default; the CLI builds its flags from these."""

    store: str = DEFAULT_URL
    durability: str = "full"
    bind: str = DEFAULT_HOST
    port: int = protocol.DEFAULT_PORT
    token_file: str | None = None  # name:token per line (queickd/tokenfile.py); reloaded on SIGHUP
    tls_cert: str | None = None  # TLS on the TCP port (api/tls.py): certificate chain, PEM; reloaded on SIGHUP
    tls_key: str | None = None  # ... and its private key
    tls_client_ca: str | None = None  # mutual TLS: clients must show a certificate this CA signed
    max_line: int = protocol.MAX_LINE
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # TCP connections at once (lowered to fit RLIMIT_NOFILE)
    hello_timeout: float = DEFAULT_HELLO_TIMEOUT  # seconds to send a first line / authenticate
    max_pending: int = DEFAULT_MAX_PENDING  # replies owed per connection before reading pauses
    ping_host: str | None = None
    ping_interval: float = DEFAULT_INTERVAL
    max_queued_per_key: int = 100
    idempotency_ttl: float = 24 * 3600.0
    event_max_attempts: int = 10
    keep_finished: float = 7 * 24 * 3600.0
    http: str | None = None  # HOST:PORT of the HTTP listener (webhooks, metrics, status page)
    http_token_file: str | None = None  # bearer token of the HTTP read endpoints
    accept_queick_clients: bool = False
    hooks: dict = field(default_factory=dict)  # [hooks.NAME] tables of the config file
    workflows: dict = field(default_factory=dict)  # [workflows.NAME] tables: definitions started by name
    # Every run's budgets where its definition names none, and the most a client's definition
    # may ask (0: no limit): core/workflow/model.py has the defaults and why.
    workflow_max_transitions: int = WORKFLOW_DEFAULTS["max_transitions"]
    workflow_max_for_each_items: int = WORKFLOW_DEFAULTS["max_for_each_items"]
    workflow_max_state_bytes: int = WORKFLOW_DEFAULTS["max_state_bytes"]
    workflow_max_cost_units: int = 0
    workflow_max_started_workflows: int = WORKFLOW_DEFAULTS["max_started_workflows"]
    # [functions."module:func"]: a function's job defaults (core/policy/resources.py) and its
    # isolation, limits and credentials (core/sandbox.py)
    functions: dict = field(default_factory=dict)
    # [upstream]: the daemon this one forwards matching jobs to (services/forwarder/settings.py)
    upstream: dict = field(default_factory=dict)

    @property
    def admission(self) -> Admission:
        from .core.policy.admission import Admission

        return Admission(self.max_queued, self.max_queued_per_key, self.idempotency_ttl)

    @property
    def workflow_budget(self) -> dict[str, int]:
        """The operator's workflow budgets: {budget: limit}, those set to 0 left out."""
        return {k: v for k in WORKFLOW_BUDGETS if (v := getattr(self, f"workflow_{k}"))}

    @property
    def resources(self) -> Resources:
        from .core.policy.resources import parse as parse_resources

        return parse_resources(self.functions, self.budgets, self.budget_patience, self.fair_shares)

    def read_http_token(self) -> str | None:
        path = self.http_token_file
        if path is None:
            return None
        try:
            with open(path, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as e:  # a missing token file does not appear by restarting: EX_CONFIG
            raise ValueError(f"cannot read token file {path}: {e.strerror or e}") from None
        if not token:
            raise ValueError(f"token file {path} is empty")
        return token


@dataclass
class WorkerConfig(_RunsJobs):
    """Every setting of an external worker (`queick worker`) with its default."""

    @property
    def resources(self) -> Resources:
        """A worker's: the budgets of --config (job defaults are the daemons')."""
        from .core.policy.resources import parse as parse_resources

        return parse_resources({}, self.budgets, self.budget_patience, self.fair_shares)

