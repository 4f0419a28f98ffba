"""What a daemon refuses to start with: every setting of `queick run` checked before anything
is opened, so a setting that cannot work is a configuration error (exit 78) naming it, never
a failure found per job. A worker's own are workerproc.validate's; both share
settings.check_shared."""

from __future__ import annotations

from .api.hooks import parse_hooks
from .api.tls import server_context
from .core import sandbox
from .run import credentials
from .services.netcheck import parse_target
from .services.pool_size import adaptive_size
from .settings import Config, check_shared


def validate(config: Config) -> None:
    """Raises ValueError naming the first setting the daemon cannot start with."""
    if config.durability not in ("full", "normal"):
        raise ValueError("durability must be 'full' or 'normal'")
    if not 0 <= config.port <= 65535:
        raise ValueError("port must be 0-65535")
    if config.workers < 0:
        raise ValueError("workers must be 0 or more")
    check_shared(config)
    if config.stop_timeout < 0 or config.sweep <= 0 or config.max_orphan_requeues < 0:
        raise ValueError("stop_timeout, sweep and max_orphan_requeues must not be negative")
    if min(config.max_queued, config.max_queued_per_key, config.event_max_attempts) < 1:
        raise ValueError("max_queued, max_queued_per_key and event_max_attempts must be at least 1")
    if min(config.max_connections, config.max_pending) < 1 or not config.hello_timeout > 0:
        raise ValueError("max_connections and max_pending must be at least 1; hello_timeout must be positive")
    if not config.pool or not all(config.pool) or not config.heartbeat > 0:
        raise ValueError("give at least one non-empty pool; heartbeat must be positive")
    if config.memory_reserve < 0 or (config.max_rss is not None and not config.max_rss > 0):
        raise ValueError("memory_reserve must not be negative, max_rss must be positive")
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
    config.resources  # noqa: B018 - raises ValueError naming a bad table or field
    adaptive_size(config.workers, config.min_workers, config.max_workers, config.idle_grace)
    # A function's credential the daemon does not have would fail each of its jobs.
    credentials.check(sandbox.settings(config).functions or {})
    if config.ping_host is not None:
        parse_target(config.ping_host)
        if not config.ping_interval > 0:
            raise ValueError("ping_interval must be positive")
