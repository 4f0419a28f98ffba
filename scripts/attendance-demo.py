#!/usr/bin/env python3
"""The attendance terminal end to end on one machine, no hardware: a queickd daemon, the
terminal reading nfcpy's emulated `udp` reader, and an emulated FeliCa card tapped every
few seconds (Alice and Bob take turns). Posts go to a local stand-in for Slack that
prints them, or to a real channel with --slack-token-file and --slack-channel.

    pip install '.[nfc,slack]'
    python scripts/attendance-demo.py --every 5

Ctrl-C stops everything; the queue and the attendance log stay in --dir.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CARDS = {"Alice": "0102030405060708", "Bob": "01020304050607AA"}


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def printing_slack() -> str:
    """A local Web API stand-in that prints every chat.postMessage; returns its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            print(f"[slack #{body.get('channel')}] {body.get('text')}", flush=True)
            data = json.dumps({"ok": True, "ts": f"{time.time():.6f}"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/api/"


def tap_in_turns(tap: Callable[[str], None], every: float, stop: threading.Event,
                 clock: Callable[[], float] = time.monotonic) -> None:
    """Tap each card in turn, a tap starting every `every` seconds, until `stop` is set. A tap
    takes as long as the terminal takes to read the card, so the wait is to the next tap's
    time, not `every` after the tap ended; a tap longer than `every` is followed at once."""
    due = clock()
    for name in itertools.cycle(CARDS):
        print(f"--- {name} taps their card", flush=True)
        tap(name)
        due = max(due + every, clock())
        if stop.wait(due - clock()):
            return


def start_daemon(workdir: Path) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "queickd", "run", "--store", f"sqlite:///{workdir / 'queue.db'}", "--port", "0",
         "--app-dir", str(workdir), "--allow", "queickd.attendance.*"],
        stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # type: ignore[union-attr]
        sys.stderr.write("[queickd] " + line)
        if m := re.search(r"listening on \S+:(\d+)", line):
            threading.Thread(target=lambda: [sys.stderr.write("[queickd] " + x) for x in proc.stderr],
                             daemon=True).start()
            return proc, int(m.group(1))
    raise SystemExit("queickd did not start")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--every", type=float, default=5.0, help="seconds between taps (default: 5)")
    p.add_argument("--dir", help="where the queue and attendance log live (default: a new temp dir)")
    p.add_argument("--slack-token-file", help="post to real Slack with this bot token file")
    p.add_argument("--slack-channel", default="C0DEMO", help="channel to post to")
    a = p.parse_args()
    try:
        from queickd.attendance.emulate import felica_tap
        from queickd.attendance.punchlog import PunchLog
    except ImportError as e:
        raise SystemExit(f"the demo needs the nfc extra: pip install '.[nfc,slack]' ({e})") from None

    workdir = Path(a.dir or tempfile.mkdtemp(prefix="queickd-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "attendance.db"
    with PunchLog(str(db)) as plog:
        for name, idm in CARDS.items():
            plog.register(idm, name)
    slack: list[str] = ["--slack-channel", a.slack_channel]
    if a.slack_token_file:
        slack += ["--slack-token-file", a.slack_token_file]
    else:
        token = workdir / "demo-token"
        token.write_text("xoxb-demo\n")
        slack += ["--slack-token-file", str(token), "--slack-base-url", printing_slack()]

    daemon, port = start_daemon(workdir)
    udp = free_port(socket.SOCK_DGRAM)
    terminal = subprocess.Popen(
        [sys.executable, "-m", "queickd", "attendance", "run", "--reader", f"udp:127.0.0.1:{udp}",
         "--targets", "212F", "--db", str(db), "--port", str(port), "--debounce", "0", *slack])
    print(f"demo in {workdir}: queickd on port {port}, reader udp:127.0.0.1:{udp}; Ctrl-C stops", flush=True)
    # nfcpy's connect() swallows KeyboardInterrupt, so a signal sets a flag instead.
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        tap_in_turns(lambda name: felica_tap(udp, CARDS[name]), a.every, stop)
    finally:
        for proc in (terminal, daemon):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (terminal, daemon):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"stopped; the punches: python -m queickd attendance report --db {db}", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.pop("HTTP_PROXY", None)
    os.environ.pop("http_proxy", None)
    sys.exit(main())
