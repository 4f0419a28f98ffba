"""The `[upstream]` section of the config file: where an edge daemon forwards which jobs,
and the caps of its forwarding. Defaults are sized for a Raspberry Pi on an SD card."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ... import tokenfile
from ...core.policy.forward import Route

SCHEMES = {"queickd": False, "queickd+tls": True}  # scheme: TLS
DEFAULT_BATCH_JOBS = 500  # jobs per batch: one pipelined exchange, one commit upstream
DEFAULT_BACKLOG_JOBS = 500_000  # held jobs at most: a few hundred MB of an SD card
DEFAULT_BACKLOG_BYTES = 256 * 1024 * 1024  # their functions' and arguments' bytes at most
DEFAULT_TIMEOUT = 10.0  # seconds without a reply before the link counts as down (a blackhole)
DEFAULT_RETRY_MAX = 60.0  # the longest pause between reconnect attempts
DEFAULT_SETTLE_EVERY = 60.0  # seconds between reads of forwarded jobs' upstream state

# Every key of [upstream], with what it means (the config reference is made from this).
KEYS = {
    "url": "the upstream daemon: queickd+tls://HOST:PORT (TLS) or queickd://HOST:PORT (plaintext, for a tunnel)",
    "functions": 'the jobs that go upstream: fnmatch patterns of their functions, as ["app:*"]; '
                 "the others run here",
    "token_file": "the token this edge sends upstream (a file of one token, or name:token lines: the first)",
    "ca_file": "the CA that signed the upstream's certificate (default: the system's CAs)",
    "identity": "this edge's name in its forwarded jobs' idempotency keys (default: the host name); "
                "unique in the fleet",
    "batch_jobs": f"jobs per batch (default {DEFAULT_BATCH_JOBS})",
    "bytes_per_second": "the most bytes of jobs (functions and arguments) sent a second (default 0: no cap)",
    "max_backlog_jobs": f"the most jobs held for the upstream; past it an enqueue gets queue_full "
                        f"(default {DEFAULT_BACKLOG_JOBS:,})",
    "max_backlog_bytes": f"the most bytes of jobs held; past it, queue_full (default {DEFAULT_BACKLOG_BYTES:,})",
    "timeout": f"seconds without a reply before the link counts as down and the batch is sent again "
               f"(default {DEFAULT_TIMEOUT:g})",
    "retry_max": f"the longest pause between reconnects, which double from 1 s (default {DEFAULT_RETRY_MAX:g})",
    "settle_every": f"seconds between reads of the upstream state of forwarded jobs not final yet "
                    f"(default {DEFAULT_SETTLE_EVERY:g})",
}


@dataclass(frozen=True)
class UpstreamSettings:
    host: str
    port: int
    tls: bool
    route: Route
    identity: str  # this edge's name in its jobs' keys upstream
    token_file: str | None = None
    ca_file: str | None = None
    batch_jobs: int = DEFAULT_BATCH_JOBS
    bytes_per_second: int = 0  # 0: no cap
    max_backlog_jobs: int = DEFAULT_BACKLOG_JOBS
    max_backlog_bytes: int = DEFAULT_BACKLOG_BYTES
    timeout: float = DEFAULT_TIMEOUT
    retry_max: float = DEFAULT_RETRY_MAX
    settle_every: float = DEFAULT_SETTLE_EVERY

    @property
    def url(self) -> str:
        return f"{'queickd+tls' if self.tls else 'queickd'}://{self.host}:{self.port}"

    def read_token(self) -> str | None:
        """The token file's token, read at each connect (a renewed token is used at once)."""
        return None if self.token_file is None else tokenfile.first_token(self.token_file)


def parse(section: dict[str, Any]) -> UpstreamSettings | None:
    """The settings of an `[upstream]` table (None for an empty one); ValueError for a bad one."""
    if not section:
        return None
    unknown = set(section) - set(KEYS)
    if unknown:
        raise ValueError(f"upstream: unknown setting(s) {', '.join(sorted(unknown))} (known: {', '.join(KEYS)})")
    url = section.get("url")
    if not isinstance(url, str):
        raise ValueError('upstream: url is required, as url = "queickd+tls://central:9999"')
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise ValueError(f"upstream: url {url!r} must be queickd+tls://HOST:PORT or queickd://HOST:PORT")
    functions = section.get("functions")
    if not isinstance(functions, list) or not functions or not all(isinstance(f, str) and f for f in functions):
        raise ValueError('upstream: functions must be a list of patterns, as functions = ["app:*"]')
    numbers: dict[str, Any] = {}
    for name, kind in (("batch_jobs", int), ("bytes_per_second", int), ("max_backlog_jobs", int),
                       ("max_backlog_bytes", int), ("timeout", float), ("retry_max", float),
                       ("settle_every", float)):
        if name in section:
            v = section[name]
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0 or (kind is int and v != int(v)):
                raise ValueError(f"upstream: {name} must be a number >= 0, not {v!r}")
            numbers[name] = kind(v)
    if numbers.get("batch_jobs") == 0 or numbers.get("timeout") == 0:
        raise ValueError("upstream: batch_jobs and timeout must be above 0")
    for name in ("token_file", "ca_file", "identity"):
        if name in section and not isinstance(section[name], str):
            raise ValueError(f"upstream: {name} must be a string")
    return UpstreamSettings(
        host=parts.hostname, port=parts.port or 9999, tls=SCHEMES[parts.scheme],
        route=Route(tuple(functions)), identity=section.get("identity") or socket.gethostname(),
        token_file=section.get("token_file"), ca_file=section.get("ca_file"), **numbers)
