"""The machine's raw limits, measured by bench/probes.py's raw kinds (run by bench/run.py):
SQLite commits in a WAL file at a synchronous level (a stream, and lone ones), and request /
response round trips on a loopback connection (a stream, and lone ones between two idle
processes). No queue: the floors the queue scenarios are read against. Standard library
only, like probes.py.
"""

from __future__ import annotations

import argparse
import os
import socket
import sqlite3
import sys
import time
from typing import Any


def sqlite_commits(a: argparse.Namespace) -> dict[str, Any]:
    """Commits/s into a WAL database at the given synchronous level, k rows per commit."""
    path = os.path.join(a.dir, "raw.db")
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute(f"PRAGMA synchronous={a.sync}")
    c.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, func TEXT NOT NULL, run_at REAL NOT NULL)")
    row = ("benchjobs:noop", 0.0)
    rows = [row] * a.rows
    commits = 0
    deadline = time.perf_counter() + a.seconds
    t0 = time.perf_counter()
    while commits < a.max_commits:
        c.execute("BEGIN IMMEDIATE")
        c.executemany("INSERT INTO t (func, run_at) VALUES (?, ?)", rows)
        c.execute("COMMIT")
        commits += 1
        if time.perf_counter() >= deadline:
            break
    elapsed = time.perf_counter() - t0
    c.close()
    return {"commits": commits, "rows_per_commit": a.rows, "seconds": elapsed,
            "rate": commits / elapsed, "rows_per_s": commits * a.rows / elapsed, "sync": a.sync}


def sqlite_lone_commits(a: argparse.Namespace) -> dict[str, Any]:
    """Latency of lone fsync'd commits (WAL, synchronous=FULL, one row), --interval s apart:
    what one durable ack costs the disk when it is not one of a stream, as in the latency
    scenario. The floor under queickd's enqueue→start latency at full durability."""
    path = os.path.join(a.dir, "raw.db")
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute(f"PRAGMA synchronous={a.sync}")
    c.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, func TEXT NOT NULL, run_at REAL NOT NULL)")
    took = []
    for _ in range(a.n):
        t0 = time.perf_counter()
        c.execute("BEGIN IMMEDIATE")
        c.execute("INSERT INTO t (func, run_at) VALUES (?, ?)", ("benchjobs:noop", 0.0))
        c.execute("COMMIT")
        took.append(time.perf_counter() - t0)
        time.sleep(a.interval)
    c.close()
    return {"n": a.n, "interval": a.interval, "sync": a.sync, **_percentiles_ms(took)}


def _percentiles_ms(seconds: list[float]) -> dict[str, float]:
    took = sorted(seconds)
    pick = lambda q: took[min(len(took) - 1, int(q * len(took)))] * 1e3  # noqa: E731
    return {"p50_ms": pick(0.5), "p90_ms": pick(0.9), "p99_ms": pick(0.99)}


def tcp_echo_server(a: argparse.Namespace) -> dict[str, Any]:
    """Serve one connection on loopback: echo every read back. Ends when the client leaves
    or after --max-seconds."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(30.0)
    print(f"listening on 127.0.0.1:{srv.getsockname()[1]}", file=sys.stderr, flush=True)
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.settimeout(a.max_seconds)
    served = 0
    deadline = time.monotonic() + a.max_seconds
    while time.monotonic() < deadline:
        data = conn.recv(65536)
        if not data:
            break
        conn.sendall(data)
        served += 1
    conn.close()
    srv.close()
    return {"served": served}


def _echo_client(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10.0)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _round_trip(s: socket.socket) -> None:
    s.sendall(b"ping\n")
    got = b""
    while not got.endswith(b"\n"):
        part = s.recv(64)
        if not part:
            raise SystemExit("echo server closed the connection")
        got += part


def tcp_rtt(a: argparse.Namespace) -> dict[str, Any]:
    """Request/response round trips per second on one loopback connection (a 5-byte line)."""
    s = _echo_client(a.port)
    trips = 0
    deadline = time.perf_counter() + a.seconds
    t0 = time.perf_counter()
    while trips < a.max_trips:
        _round_trip(s)
        trips += 1
        if time.perf_counter() >= deadline:
            break
    elapsed = time.perf_counter() - t0
    s.close()
    return {"trips": trips, "seconds": elapsed, "rate": trips / elapsed}


def tcp_lone_rtt(a: argparse.Namespace) -> dict[str, Any]:
    """Latency of lone request/response round trips on one loopback connection, --interval s
    apart: what two processes that were idle pay to wake and answer each other, as in the
    latency scenario. The floor under every queue's enqueue→start latency on this machine."""
    s = _echo_client(a.port)
    took = []
    for _ in range(a.n):
        time.sleep(a.interval)
        t0 = time.perf_counter()
        _round_trip(s)
        took.append(time.perf_counter() - t0)
    s.close()
    return {"n": a.n, "interval": a.interval, **_percentiles_ms(took)}
