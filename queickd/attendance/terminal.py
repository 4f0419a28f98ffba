"""The terminal: a reader loop, the punch log, and the hand-off of punches to the daemon.

It runs beside the daemon, as its own process (`queick attendance run`), and talks to it
over TCP with the ordinary client. Why not inside: reader drivers (libusb, serial ports)
block in C and can wedge or crash a process, and they need device access the queue does
not; a wedged reader must not stop the queue from posting what is already punched, and
the daemon must stay standard-library only. The post jobs themselves run in the
daemon's workers (`--allow 'queickd.attendance.*'`), which is what retries them.

Order of events for a tap: the punch is committed to the attendance log (fsync'd), the
feedback command runs, and only then is the post job enqueued, with the punch id as
its idempotency key. A punch whose enqueue failed (daemon down, restarting) stays
"unsent" in the log and the dispatcher sends it, in tap order, when the daemon answers
again, with backoff. A tap that was acknowledged (the feedback runs only after the
commit) is never lost, whichever process is killed when; a resend after a crash between
an enqueue and its bookkeeping names the same job (the idempotency key).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import tokenfile
from ..client import JobQueue
from ..core.cron import CronExpr
from ..core.protocol import DEFAULT_PORT, Code, QueueError
from ..services import sdnotify
from .feedback import Feedback
from .message import DEFAULT_LATE_AFTER
from .punchlog import (
    ACCEPTED,
    DEFAULT_DAY_BOUNDARY,
    DEFAULT_DEBOUNCE,
    DEFAULT_UNKNOWN_CARDS,
    PunchLog,
    Tap,
    parse_day_boundary,
)
from .readers import DEFAULT_TARGETS, REOPEN_BACKOFF, Looping, Reader, ReaderLoop, make_reader
from .slack import SlackTarget

log = logging.getLogger("queickd.attendance")

POST_FUNC = "queickd.attendance.slack:post_punch"
SUMMARY_FUNC = "queickd.attendance.slack:post_daily_summary"
SUMMARY_CRON = "attendance:daily-summary"
POST_KEY = "attendance"  # one post at a time, in tap order
# The post job's retries. A network-class failure parks it for the network instead
# (retry_on_network); an HTTP 429 blocks the post's rate key (TerminalConfig.slack_rate) for its
# Retry-After, no attempt spent.
POST_RETRY = {"retry": True, "retry_type": "exponential", "retry_interval": 2.0,
              "max_retry_interval": 600.0, "max_attempts": 20}


@dataclass
class TerminalConfig:
    """Every terminal setting with its default; `queick attendance run` builds its flags from these."""

    reader: str = ""
    targets: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))
    db: str = "attendance.db"
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token_file: str | None = None
    debounce: float = DEFAULT_DEBOUNCE
    day_boundary: str = DEFAULT_DAY_BOUNDARY
    unknown_cards: str = DEFAULT_UNKNOWN_CARDS
    feedback: str | None = None
    slack_channel: str | None = None
    slack_token_file: str | None = None
    slack_webhook_file: str | None = None
    slack_base_url: str | None = None
    late_after: float = DEFAULT_LATE_AFTER
    slack_rate: float = 1.0  # posts a second to one channel, at most (the posts' rate_limit)
    daily_summary: str | None = None  # a cron expression, e.g. '0 19 * * *'
    # The posts' serial key: one post at a time, in tap order. A fleet's terminals that
    # forward to one central daemon each take their own, so one's outage holds no other's.
    post_key: str = POST_KEY

    @property
    def slack(self) -> SlackTarget:
        # Absolute paths: the job runs in the daemon, whose working directory is its own.
        token, webhook = (None if p is None else os.path.abspath(p)
                          for p in (self.slack_token_file, self.slack_webhook_file))
        return SlackTarget(channel=self.slack_channel, token_file=token, webhook_file=webhook,
                           base_url=self.slack_base_url, late_after=self.late_after)

    def validate(self) -> None:
        if not self.reader:
            raise ValueError("give a reader: --reader usb | tty:AMA0:pn532 | udp:HOST:PORT | /dev/ttyUSB0 | "
                             "socket://HOST:PORT")
        parse_day_boundary(self.day_boundary)
        if self.daily_summary is not None:
            CronExpr.parse(self.daily_summary)  # ValueError names what is wrong
        if self.debounce < 0 or self.late_after < 0:
            raise ValueError("debounce and late_after must not be negative")
        if not 0.001 <= self.slack_rate <= 1000:
            raise ValueError("slack_rate must be posts a second from 0.001 to 1000")
        self.slack.validate()

    def read_token(self) -> str | None:
        if self.token_file is None:
            return None
        return tokenfile.first_token(self.token_file)  # as every client reads QUEICKD_TOKEN_FILE

    def open_log(self) -> PunchLog:
        return PunchLog(self.db, debounce=self.debounce, day_boundary=parse_day_boundary(self.day_boundary),
                        unknown_cards=self.unknown_cards)


class Dispatcher(Looping):
    """Hands unsent punches to the daemon in tap order; sleeps until woken, or until
    its backoff ends while the daemon cannot be reached. start()/wake()/stop()."""

    thread_name = "attendance-dispatch"

    def __init__(self, plog: PunchLog, queue: JobQueue, config: TerminalConfig,
                 backoff: tuple[float, ...] = REOPEN_BACKOFF) -> None:
        self.plog = plog
        self.queue = queue
        self.config = config
        self.backoff = backoff
        self.sent = 0  # punches handed over by this process
        self._sent_cv = threading.Condition()  # notified by the dispatcher thread after each hand-over
        self._cron_done = config.daily_summary is None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._slack = config.slack.to_dict()
        self._rate_limit = config.slack.rate_limit(config.slack_rate)  # Slack's pace, kept by the queue
        self._db = os.path.abspath(config.db)

    def wake(self) -> None:
        self._wake.set()

    def wait_sent(self, n: int, timeout: float) -> bool:
        """Block until this process has handed over n punches; False on timeout."""
        with self._sent_cv:
            return self._sent_cv.wait_for(lambda: self.sent >= n, timeout)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._send_all()
                failures, wait = 0, None
            except (ConnectionError, OSError, QueueError) as e:
                wait = self.backoff[min(failures, len(self.backoff) - 1)]
                failures += 1
                hint = ""
                if isinstance(e, QueueError) and e.code == Code.NOT_ALLOWED:
                    hint = "; start the daemon with --allow 'queickd.attendance.*'"
                log.warning("cannot hand punches to queickd at %s:%d (%s%s); they are safe in %s, trying "
                            "again in %g s", self.queue.host, self.queue.port, e, hint, self.config.db, wait)
            self._wake.wait(wait)
            self._wake.clear()

    def _send_all(self) -> None:
        if not self._cron_done:
            try:
                self.queue.cron(self.config.daily_summary, SUMMARY_FUNC, args=[self._db, self._slack,
                                parse_day_boundary(self.config.day_boundary)], name=SUMMARY_CRON, **POST_RETRY,
                                retry_on_network_available=True, rate_limit=self._rate_limit)
                log.info("daily summary registered with queickd (%s)", self.config.daily_summary)
            except QueueError as e:
                if e.code != Code.BAD_REQUEST:
                    raise
                log.error("the daily summary could not be registered: %s", e)  # punches go on regardless
            self._cron_done = True
        while not self._stop.is_set():
            batch = self.plog.unsent(50)
            if not batch:
                return
            for p in batch:
                job_id = self.queue.enqueue(POST_FUNC, [p.to_dict(), self._slack, self._db], key=self.config.post_key,
                                            idempotency_key=p.punch_id, retry_on_network_available=True,
                                            rate_limit=self._rate_limit, **POST_RETRY)
                self.plog.mark_enqueued(p.punch_id, job_id)
                with self._sent_cv:
                    self.sent += 1
                    self._sent_cv.notify_all()
                log.info("punch %s handed to queickd as job %d", p.punch_id, job_id)


class Terminal:
    """Reader loop + punch log + feedback + dispatcher. start()/stop()."""

    def __init__(self, config: TerminalConfig, reader: Reader | None = None,
                 queue: JobQueue | None = None) -> None:
        config.validate()
        self.config = config
        self.plog = config.open_log()
        self.feedback = Feedback(config.feedback)
        self.queue = queue or JobQueue(config.host, config.port, token=config.read_token())
        self.dispatcher = Dispatcher(self.plog, self.queue, config)
        self.loop = ReaderLoop(reader or make_reader(config.reader, config.targets), self.on_card)
        self.on_tap: Callable[[Tap], None] | None = None  # for tests and embedding

    def on_card(self, card_id: str) -> None:
        try:
            tap = self.plog.record_tap(card_id)
        except Exception:
            self.feedback.error(card_id)  # the person must know this tap did not count
            raise
        if tap.outcome != ACCEPTED:
            log.info("tap of card %s%s ignored: %s", card_id, f" ({tap.name})" if tap.name else "", tap.reason)
        elif tap.reason == "unknown card":
            log.warning("unknown card %s tapped%s; register it with 'queick attendance register --card %s "
                        "--name NAME'", card_id, "" if tap.punch else " (not posted again)", card_id)
        else:
            p = tap.punch
            assert p is not None
            extra = f"; no clock-out was recorded on {p.missed_out_day}" if p.missed_out_day else ""
            log.info("punch %s: %s %s (card %s)%s", p.punch_id, p.name, p.direction, card_id, extra)
        self.feedback(tap)
        if tap.punch is not None:
            self.dispatcher.wake()
        if self.on_tap is not None:
            self.on_tap(tap)

    def start(self) -> None:
        unsent = len(self.plog.unsent(1_000_000))
        if unsent:
            log.info("%d punch(es) in %s are not yet with queickd; sending them first", unsent, self.config.db)
        if self.config.slack_token_file is None and self.config.slack_webhook_file is None:
            log.info("no Slack token or webhook file given: the post jobs read the daemon's systemd "
                     "credential slack-token or slack-webhook")
        self.dispatcher.start()
        self.loop.start()
        log.info("attendance terminal ready: reader %s, log %s, queickd %s:%d, debounce %g s, day starts %s",
                 self.config.reader, self.config.db, self.config.host, self.config.port, self.config.debounce,
                 self.config.day_boundary)

    def stop(self) -> None:
        """Idempotent. The reader stops first, so no tap is accepted that cannot be logged."""
        self.loop.stop()
        self.dispatcher.stop()
        self.queue.close()
        self.plog.close()

    def run_forever(self) -> None:
        """Start, run until SIGTERM/SIGINT, stop; READY and WATCHDOG for systemd."""
        signals = sdnotify.Signals()
        stop = threading.Event()
        self.start()
        sdnotify.notify("READY=1")
        sdnotify.start_watchdog(lambda: self.loop.alive and self.dispatcher.alive, stop)
        signals.wait(stop, on_hup=lambda: log.info("SIGHUP: the attendance terminal has nothing to reload"))
        sdnotify.notify("STOPPING=1")
        log.info("stopping the attendance terminal")
        self.stop()

