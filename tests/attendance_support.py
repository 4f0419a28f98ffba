"""Support for the attendance tests: a serial card reader behind socket:// and an
in-process terminal wired to a real daemon."""

from __future__ import annotations

import queue
import socket
import threading
from pathlib import Path

from queickd.attendance.punchlog import Tap
from queickd.attendance.terminal import Terminal, TerminalConfig

ALLOW = ("--allow", "queickd.attendance.*")


class CardFeed:
    """A line-printing card reader on a TCP port, as pyserial's socket:// sees it: each
    tap() writes one card id line to the connected terminal. unplug() drops the
    connection and stops listening; replug() listens on the same port again."""

    def __init__(self) -> None:
        self.port = 0
        self._sock: socket.socket | None = None
        self._conns: queue.Queue[socket.socket] = queue.Queue()
        self._conn: socket.socket | None = None
        self.replug()

    @property
    def url(self) -> str:
        return f"socket://127.0.0.1:{self.port}"

    def replug(self) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(4)
        self.port = s.getsockname()[1]
        self._sock = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, s: socket.socket) -> None:
        while True:
            try:
                conn, _ = s.accept()
            except OSError:
                return
            self._conns.put(conn)

    def connection(self, timeout: float = 20.0) -> socket.socket:
        """The reader's connection (waits for the terminal to open the reader)."""
        if self._conn is None:
            self._conn = self._conns.get(timeout=timeout)
        return self._conn

    def tap(self, card_id: str, timeout: float = 20.0) -> None:
        """Send one card id line; the reader must be open (RunningTerminal.wait_reader_open)."""
        self.connection(timeout).sendall(card_id.encode() + b"\r\n")

    def unplug(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
            self._sock = None

    close = unplug


class RunningTerminal:
    """A Terminal started in this process; taps land in `taps` as they are decided."""

    def __init__(self, config: TerminalConfig) -> None:
        self.terminal = Terminal(config)
        self.taps: queue.Queue[Tap] = queue.Queue()
        self.terminal.on_tap = self.taps.put
        self.plog = self.terminal.plog
        self.terminal.start()

    def wait_reader_open(self, count: int = 1, timeout: float = 20.0) -> None:
        # A serial port flushes its input as it opens: tap after that, as a person would.
        assert self.terminal.loop.wait_open(count, timeout), "the reader did not open"

    def next_tap(self, timeout: float = 20.0) -> Tap:
        return self.taps.get(timeout=timeout)

    def wait_sent(self, n: int, timeout: float = 20.0) -> None:
        assert self.terminal.dispatcher.wait_sent(n, timeout), f"only {self.terminal.dispatcher.sent} of {n} sent"

    def job_id(self, punch_id: str) -> int:
        p = self.plog.punch(punch_id)
        assert p is not None and p.job_id is not None, p
        return p.job_id

    def stop(self) -> None:
        self.terminal.stop()


def terminal_config(tmp_path: Path, reader: str, daemon_port: int, **kw) -> TerminalConfig:
    token = tmp_path / "slack-token"
    if not token.exists():
        token.write_text("xoxb-test-token\n")
    kw.setdefault("slack_token_file", str(token))
    kw.setdefault("slack_channel", "C0ATTEND")
    return TerminalConfig(reader=reader, db=str(tmp_path / "attendance.db"), port=daemon_port, **kw)


ALICE_IDM, BOB_IDM, CAROL_UID = "0102030405060708", "01020304050607AA", "08112233"


def terminals(tmp_path: Path):
    """For a fixture (`yield from terminals(tmp_path)`): start in-process terminals on a reader path with Alice, Bob and Carol registered.
    Their daemon port has nothing listening: these tests look at the log, not at posts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nowhere = s.getsockname()[1]
    started: list[RunningTerminal] = []

    def start(reader: str, **kw) -> RunningTerminal:
        t = RunningTerminal(terminal_config(tmp_path, reader, nowhere, **kw))
        for card, name in ((ALICE_IDM, "Alice"), (BOB_IDM, "Bob"), (CAROL_UID, "Carol")):
            t.plog.register(card, name)
        started.append(t)
        return t

    yield start
    for t in started:
        t.stop()
