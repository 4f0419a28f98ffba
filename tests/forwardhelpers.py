"""Two daemons on loopback, an edge forwarding to a central one through a LinkProxy."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from linkproxy import LinkProxy

NONE_HELD = r"forwarded \d+ job\(s\) to .*; none held"


@pytest.fixture
def central(start_daemon, tmp_path):
    """The central daemon, on a SQLite store of its own."""
    return start_daemon(f"sqlite:///{tmp_path / 'central.db'}")


@pytest.fixture
def proxy(central):
    """The link to the central: a LinkProxy the test can pass, refuse, cut or blackhole."""
    p = LinkProxy(central.port)
    yield p
    p.close()


def start_edge(start_daemon, tmp_path: Path, proxy: LinkProxy, *flags: str, **config):
    """An edge daemon forwarding through `proxy` (`config`: edge_config's keywords)."""
    return start_daemon(f"sqlite:///{tmp_path / 'edge.db'}", *flags, "--config",
                        edge_config(tmp_path / "edge.toml", proxy, **config))


def edge_config(path: Path, proxy: LinkProxy, *, functions=("testjobs:*",), extra: str = "",
                scheme: str = "queickd", identity: str = "edge-1") -> str:
    path.write_text(
        "[upstream]\n"
        f'url = "{scheme}://127.0.0.1:{proxy.port}"\n'
        f"functions = [{', '.join(repr(f).replace(chr(39), chr(34)) for f in functions)}]\n"
        f'identity = "{identity}"\n'
        "timeout = 2.0\n"
        "retry_max = 1.0\n"  # tests: a returned link is found within a second
        "settle_every = 1.0\n" + extra)
    return str(path)


def held_count(q, n: int, timeout: float = 10.0) -> int:
    """The edge's `upstream.held` once it reads `n`, or the last read after `timeout`. The
    count grows after each commit's ack (the post-commit hook), so a read right after an
    ack may not hold that commit's jobs yet."""
    deadline = time.monotonic() + timeout
    while (held := q.stats()["upstream"]["held"]) != n and time.monotonic() < deadline:
        time.sleep(0.01)
    return held


def central_keys(db: Path) -> dict[int, int]:
    """{edge job id: copies} of the forwarded jobs in the central's SQLite store."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        rows = c.execute("SELECT idempotency_key, count(*) FROM jobs WHERE idempotency_key LIKE"
                         " 'queickd-forward:%' GROUP BY 1").fetchall()
    return {int(k.split(":")[2]): n for k, n in rows}


def central_order(db: Path) -> list[int]:
    """The edge job ids of the forwarded jobs, in the central's id order."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        rows = c.execute("SELECT idempotency_key FROM jobs WHERE idempotency_key LIKE 'queickd-forward:%'"
                         " ORDER BY id").fetchall()
    return [int(k.split(":")[2]) for (k,) in rows]


def edge_ids(db: Path) -> dict[int, str]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        return dict(c.execute("SELECT id, state FROM jobs").fetchall())
