"""Card readers, and the loop that keeps one open.

A reader turns a card on its surface into the card's id (hex: the FeliCa IDm or the
Type A UID) once per presentation: wait_card() returns when a card arrives, and
wait_release() returns when it has left, so a card held on the reader is one tap.

  NfcReader   any nfcpy device path: `usb` (RC-S380 and friends), `tty:AMA0:pn532`
              (PN532 over UART, opened through pyserial), `udp:HOST:PORT` (nfcpy's
              emulation driver, for tests and demos)
  LineReader  a serial reader that prints one card id per line, opened with pyserial's
              serial_for_url: `/dev/ttyUSB0`, a pty, `socket://HOST:PORT`, `line:URL`

ReaderLoop owns one reader on its own thread: a reader that fails or is unplugged is
closed, logged and reopened with backoff; the loop ends only when told to stop.
nfcpy and pyserial are imported when a reader opens, never at import time.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from .punchlog import normalize_card_id

log = logging.getLogger("queickd.attendance.reader")

REOPEN_BACKOFF = (0.5, 1, 2, 5, 10, 30)  # seconds before reopening, by failures in a row
DEFAULT_TARGETS = ("212F", "106A")  # FeliCa, then ISO 14443 Type A
NFC_PREFIXES = ("usb", "tty:", "com:", "udp")


class Reader(Protocol):
    path: str

    def open(self) -> None:
        """Open the device; raises OSError (or the driver's error) when it cannot."""

    def wait_card(self, stop: threading.Event) -> str | None:
        """Block until a card is presented; its id, or None once `stop` is set."""

    def wait_release(self, stop: threading.Event) -> None:
        """Block until the card last returned has left the reader (or `stop` is set)."""

    def close(self) -> None:
        """Idempotent."""

    def interrupt(self) -> None:
        """From another thread: make a blocked wait_card() return soon (stop is set)."""


class NfcReader:
    """An nfcpy ContactlessFrontend, polled one sense at a time.

    Each poll senses the configured targets once (`iterations=1`); over `udp` an empty
    sense costs a second per target, so tests and demos name a single target."""

    def __init__(self, path: str, targets: Sequence[str] = DEFAULT_TARGETS, interval: float = 0.2,
                 presence_interval: float = 0.1) -> None:
        self.path = path
        self.targets = tuple(targets)
        self.interval = interval
        self.presence_interval = presence_interval
        self._clf = None
        self._tag = None

    def open(self) -> None:
        import nfc

        clf = nfc.ContactlessFrontend()
        if _device_file(self.path) is not None:
            clf.device = _open_tty_device(self.path)
        elif not clf.open(self.path):
            raise OSError(errno.ENODEV, f"no NFC reader found on {self.path}")
        self._clf = clf

    def _refused(self, e: OSError) -> bool:
        # nfcpy's udp driver sends its polls to a port; while no emulated card listens
        # there, the kernel answers "connection refused". That is an empty field, not a
        # broken reader.
        return self.path.startswith("udp") and e.errno == errno.ECONNREFUSED

    def wait_card(self, stop: threading.Event) -> str | None:
        import nfc.clf
        import nfc.tag

        while not stop.is_set():
            try:
                target = self._clf.sense(*[nfc.clf.RemoteTarget(t) for t in self.targets],  # type: ignore[union-attr]
                                         iterations=1)
                tag = nfc.tag.activate(self._clf, target) if target is not None else None
            except OSError as e:
                if not self._refused(e):
                    raise
                tag = None
            except nfc.clf.CommunicationError as e:  # a card swiped too fast: poll again
                log.debug("reader %s: %s", self.path, e)
                tag = None
            if tag is not None and tag.identifier:
                self._tag = tag
                return tag.identifier.hex().upper()
            stop.wait(self.interval)
        return None

    def wait_release(self, stop: threading.Event) -> None:
        import nfc.clf

        tag, self._tag = self._tag, None
        while tag is not None and not stop.is_set():
            try:
                if not tag.is_present:
                    return
            except OSError as e:
                if self._refused(e):
                    return
                raise
            except nfc.clf.CommunicationError:
                return
            stop.wait(self.presence_interval)

    def interrupt(self) -> None:
        pass  # a poll ends within its own timeout (about a second per target)

    def close(self) -> None:
        clf, self._clf, self._tag = self._clf, None, None
        if clf is not None:
            try:
                clf.close()
            except Exception as e:  # a device that is already gone may fail to close
                log.debug("reader %s: close: %s", self.path, e)


def _device_file(path: str) -> tuple[str, str] | None:
    """`tty:/dev/serial/by-id/...:pn532` → (device file, driver); None for other paths."""
    kind, _, rest = path.partition(":")
    dev, _, driver = rest.rpartition(":")
    return (dev, driver) if kind == "tty" and dev.startswith("/") and driver else None


def _open_tty_device(path: str):  # -> nfc.clf.device.Device
    """Compatibility shim: nfcpy 1.0.4 finds `tty:` ports only by their name directly in
    /dev (`tty:AMA0:pn532` is /dev/ttyAMA0), so a udev symlink such as
    /dev/serial/by-id/... (or a pty) cannot be named. For a `tty:` path with an absolute
    device file, load the driver on that file the way nfcpy's device.connect() does."""
    import importlib

    from nfc.clf import transport

    dev, driver = _device_file(path)  # type: ignore[misc]
    module = importlib.import_module("nfc.clf." + driver)
    tty = transport.TTY(dev)
    try:
        device = module.init(tty)
    except BaseException:
        tty.close()
        raise
    device._path = dev
    return device


class LineReader:
    """A serial reader that prints one card id per line. Lines that are not hex are
    logged and skipped. A reader that repeats its line while a card is held is tamed by
    the punch log's debounce. Reads block without a timeout (an idle reader costs
    nothing); interrupt() ends a read: cancel_read() where pyserial has it, else close."""

    def __init__(self, url: str, baudrate: int = 9600) -> None:
        self.path = url
        self.url = url[len("line:"):] if url.startswith("line:") else url
        self.baudrate = baudrate
        self._port = None
        self._buf = b""
        self._lines: deque[str] = deque()

    def open(self) -> None:
        import serial

        self._buf, self._lines = b"", deque()
        self._port = serial.serial_for_url(self.url, baudrate=self.baudrate, timeout=None)

    def wait_card(self, stop: threading.Event) -> str | None:
        while not stop.is_set():
            while self._lines:
                line = self._lines.popleft()
                try:
                    return normalize_card_id(line)
                except ValueError:
                    log.warning("reader %s: skipping a line that is not a card id: %r", self.path, line[:80])
            port = self._port
            if port is None:  # closed by interrupt()
                return None
            chunk = port.read(1)  # blocks; b"" after cancel_read()
            if chunk:
                chunk += port.read(port.in_waiting)
                self._buf += chunk
                *lines, self._buf = self._buf.replace(b"\r", b"\n").split(b"\n")
                self._lines.extend(s for s in (x.decode("ascii", "replace").strip() for x in lines) if s)
                if len(self._buf) > 4096:
                    log.warning("reader %s: discarding %d bytes without a line end", self.path, len(self._buf))
                    self._buf = b""
        return None

    def wait_release(self, stop: threading.Event) -> None:
        return None  # a line is already one presentation

    def interrupt(self) -> None:
        port = self._port
        if port is None:
            return
        cancel = getattr(port, "cancel_read", None)
        if cancel is not None:
            cancel()
        else:  # socket:// and friends: closing wakes the blocked read with an error
            self.close()

    def close(self) -> None:
        port, self._port = self._port, None
        if port is not None:
            try:
                port.close()
            except Exception as e:
                log.debug("reader %s: close: %s", self.path, e)


def make_reader(path: str, targets: Sequence[str] = DEFAULT_TARGETS) -> Reader:
    """An nfcpy path (usb, tty:PORT:DRIVER, com:..., udp:HOST:PORT) gives an NfcReader;
    anything else (/dev/ttyUSB0, socket://HOST:PORT, line:URL) a LineReader."""
    if path.startswith("line:") or not path.startswith(NFC_PREFIXES):
        return LineReader(path)
    return NfcReader(path, targets)


class Looping:
    """start() runs `_run` once, on a daemon thread named `thread_name`; `alive` while it runs."""

    thread_name = ""
    _thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)  # type: ignore[attr-defined]
            self._thread.start()


class ReaderLoop(Looping):
    """Runs a reader on a thread: on_card(card_id) for every presentation, then waits
    for the card to leave. Reopens a failed reader with backoff. start()/stop()."""

    thread_name = "attendance-reader"

    def __init__(self, reader: Reader, on_card: Callable[[str], None],
                 backoff: Sequence[float] = REOPEN_BACKOFF) -> None:
        self.reader = reader
        self.on_card = on_card
        self.backoff = tuple(backoff)
        self.opens = 0  # successful opens, for status and tests
        self.releases = 0  # cards that came and left again
        self._signal = threading.Condition()  # notified by the reader thread on each open and release
        self._stop = threading.Event()

    def wait_open(self, count: int, timeout: float) -> bool:
        """Block until the reader has been opened `count` times in all; False on timeout."""
        with self._signal:
            return self._signal.wait_for(lambda: self.opens >= count, timeout)

    def wait_released(self, count: int, timeout: float) -> bool:
        """Block until `count` cards in all have been presented and taken away."""
        with self._signal:
            return self._signal.wait_for(lambda: self.releases >= count, timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Idempotent; safe before start(). A driver call in progress ends within its own
        timeout (a poll is at most a couple of seconds)."""
        self._stop.set()
        if self._thread is not None:
            self.reader.interrupt()
            self._thread.join(timeout)

    def _run(self) -> None:
        failures = 0
        path = self.reader.path
        while not self._stop.is_set():
            try:
                self.reader.open()
            except Exception as e:
                delay = self.backoff[min(failures, len(self.backoff) - 1)]
                failures += 1
                log.warning("cannot open reader %s (%s); trying again in %g s", path, e, delay)
                self._stop.wait(delay)
                continue
            with self._signal:
                self.opens += 1
                self._signal.notify_all()
            log.info("reader %s open", path)
            try:
                while not self._stop.is_set():
                    card = self.reader.wait_card(self._stop)
                    if card is None:
                        break
                    failures = 0
                    try:
                        self.on_card(card)
                    except Exception:  # the tap is lost only if the log could not be written
                        log.exception("could not handle a tap of card %s", card)
                    self.reader.wait_release(self._stop)
                    with self._signal:
                        self.releases += 1
                        self._signal.notify_all()
            except Exception as e:
                if self._stop.is_set():  # interrupted on the way out
                    self.reader.close()
                    break
                delay = self.backoff[min(failures, len(self.backoff) - 1)]
                failures += 1
                log.warning("reader %s failed (%s: %s); reopening in %g s", path, type(e).__name__, e, delay)
                self.reader.close()
                self._stop.wait(delay)
                continue
            self.reader.close()
        log.info("reader %s closed", path)
