"""Helpers for tests of the HTTP listener: a daemon started with a config file and
--http on a free port, and a tiny HTTP client that never raises on an error status."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers import JOBS_DIR, DaemonProcess


def sign(secret: bytes, body: bytes) -> str:
    """The signature header value a sender computes: 'sha256=<hex>'."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


_HTTP_LISTENING = re.compile(r"HTTP endpoint http://(\S+):(\d+)/")


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Web:
    """A running daemon with its HTTP listener."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.daemon = daemon
        m = daemon.wait_for_line(_HTTP_LISTENING)
        self.host, self.port = m.group(1), int(m.group(2))

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> Reply:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        finally:
            conn.close()

    def get(self, path: str) -> Reply:
        return self.request("GET", path)

    def post_json(self, path: str, obj: Any, headers: dict[str, str] | None = None) -> Reply:
        body = json.dumps(obj).encode()
        return self.request("POST", path, body, {"Content-Type": "application/json", **(headers or {})})


def start_web(start_daemon, tmp_path: Path, config: str = "", *extra: str, store_url: str | None = None,
              **kw) -> Web:
    """Start a daemon whose config file holds `config` (TOML) plus the HTTP listener, on
    `store_url` (default: a fresh SQLite file)."""
    path = tmp_path / "queickd.toml"
    path.write_text(f'http = "127.0.0.1:0"\n{config}')
    d = start_daemon(store_url, "--config", str(path), *extra, **kw)
    return Web(d)


def scrape(web: Web) -> dict[tuple[str, tuple], float]:
    """GET /metrics, read by the Prometheus client's own parser: {(name, labels): value}."""
    from prometheus_client import parser

    r = web.get("/metrics")
    assert r.status == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in parser.text_string_to_metric_families(r.body.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


__all__ = ["JOBS_DIR", "Reply", "Web", "scrape", "start_web"]
