"""What a daemon or a worker refuses to start with: every setting checked before anything is
opened, so a setting that cannot work is a configuration error (exit 78) naming it, never a
failure found per job. One validate() for both: the settings of the part that runs jobs are
checked alike, then each kind's own."""

from __future__ import annotations

import os

from .core import sandbox
from .run import credentials
from .services.pool_size import adaptive_size
from .settings import Config, WorkerConfig


def validate(config: Config | WorkerConfig) -> None:
    """Raises ValueError naming the first setting this daemon or worker cannot start with."""
    if isinstance(config, WorkerConfig):
        _worker_only(config)
    else:
        _daemon_only(config)
    _runs_jobs(config)
    if isinstance(config, Config):
        _daemon_serves(config)


def _runs_jobs(config: Config | WorkerConfig) -> None:
    """The settings of the pool, its runner and its fleet membership, a daemon's and a worker's."""
    if config.pause_after < 0 or not config.pause_cooldown > 0:
        raise ValueError("pause_after must not be negative (0: off), pause_cooldown must be positive")
    if config.async_jobs < 0:
        raise ValueError("async_jobs must be 0 or more (0: async jobs take worker threads)")
    if not os.path.isdir(config.app_dir):
        raise ValueError(f"app directory {config.app_dir!r} does not exist")
    if config.job_user is not None:
        from .run.isolate import job_user

        job_user(config.job_user)  # ValueError: no such user, or a capability is missing
    if config.stop_timeout < 0 or config.sweep <= 0 or config.max_orphan_requeues < 0:
        raise ValueError("stop_timeout, sweep and max_orphan_requeues must not be negative")
    if not config.pool or not all(config.pool) or not config.heartbeat > 0:
        raise ValueError("give at least one non-empty pool; heartbeat must be positive")
    if config.memory_reserve < 0 or (config.max_rss is not None and not config.max_rss > 0):
        raise ValueError("memory_reserve must not be negative, max_rss must be positive")
    config.resources  # noqa: B018 - raises ValueError naming a bad table or field
    adaptive_size(config.workers, config.min_workers, config.max_workers, config.idle_grace)
    # A function's credential this process does not have would fail each of its jobs.
    credentials.check(sandbox.settings(config).functions or {})


def _worker_only(config: WorkerConfig) -> None:
    if not config.store.startswith(("postgresql://", "postgres://")):
        raise ValueError("queick worker needs a shared store: --store postgresql://...")
    if config.workers < 1 or config.max_queued < 1:
        raise ValueError("workers and max_queued must be at least 1")


def _daemon_only(config: Config) -> None:
    if config.durability not in ("full", "normal"):
        raise ValueError("durability must be 'full' or 'normal'")
    if not 0 <= config.port <= 65535:
        raise ValueError("port must be 0-65535")
    if config.workers < 0:
        raise ValueError("workers must be 0 or more")


def _daemon_serves(config: Config) -> None:
    """The settings of what a daemon serves and keeps: its listeners, admission, retention."""
    # The listeners' modules only here: a worker opens no port.
    from .api.hooks import parse_hooks
    from .api.tls import server_context
    from .services.forwarder.settings import parse as parse_upstream

    # ValueError naming the bad setting of [upstream]; an edge's held jobs are its own, and
    # several daemons sharing one store would each forward them, under keys of their own.
    if parse_upstream(config.upstream) is not None and config.store.startswith(("postgresql:", "postgres:")):
        raise ValueError("[upstream] needs a store of this daemon's own (sqlite:///...), not a shared PostgreSQL one")
    from .services.netcheck import parse_target

    if min(config.max_queued, config.max_queued_per_key, config.event_max_attempts) < 1:
        raise ValueError("max_queued, max_queued_per_key and event_max_attempts must be at least 1")
    if min(config.max_connections, config.max_pending) < 1 or not config.hello_timeout > 0:
        raise ValueError("max_connections and max_pending must be at least 1; hello_timeout must be positive")
    for k, v in config.workflow_budget.items():
        if v < 0:
            raise ValueError(f"workflow_{k} must not be negative (0: no limit)")
    if config.idempotency_ttl < 0 or config.keep_finished < 0:
        raise ValueError("idempotency_ttl and keep_finished must not be negative")
    if config.accept_queick_clients and config.token_file is not None:
        # A Queick 1.2.1 client has no way to send a token: its requests would go past it.
        raise ValueError("--accept-queick-clients cannot be combined with --token-file: Queick "
                         "1.2.1 clients cannot present a token; run a separate daemon for them, "
                         "on loopback, or move them to protocol v1")
    if config.accept_queick_clients and config.tls_cert is not None:
        raise ValueError("--accept-queick-clients cannot be combined with --tls-cert: Queick 1.2.1 clients "
                         "cannot speak TLS; run a separate daemon for them, on loopback")
    server_context(config.tls_cert, config.tls_key, config.tls_client_ca)
    if config.http is not None:
        from .api.httpd import parse_address

        parse_address(config.http)
    parse_hooks(config.hooks)
    if config.ping_host is not None:
        parse_target(config.ping_host)
        if not config.ping_interval > 0:
            raise ValueError("ping_interval must be positive")
