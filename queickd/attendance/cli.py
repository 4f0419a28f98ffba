"""`queick attendance`: the NFC attendance terminal and its card registry.

  queick attendance run --reader udp:127.0.0.1:54321 --slack-channel C123 --slack-token-file F
  queick attendance register --name Alice [--slack-user U123] (--card HEX | --last-unknown | --reader PATH)
  queick attendance cards [--unknown]
  queick attendance remove CARD
  queick attendance report [--date YYYY-MM-DD|today|yesterday]

Terminal flags can come from the environment: --some-flag reads
QUEICKD_ATTENDANCE_SOME_FLAG; the daemon's address and token use the client's
QUEICKD_HOST, QUEICKD_PORT and QUEICKD_TOKEN_FILE. Nothing here needs nfcpy or
slack-sdk until a reader is opened or a post is made.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import log
from ..ui.text import local_time
from .message import day_report, span
from .punchlog import UNKNOWN_POLICIES, PunchLog, parse_day_boundary, work_day
from .terminal import Terminal, TerminalConfig

EX_CONFIG = 78
_D = TerminalConfig()
_CLIENT_ENV = {"host": "QUEICKD_HOST", "port": "QUEICKD_PORT", "token_file": "QUEICKD_TOKEN_FILE"}


def _opt(p: argparse.ArgumentParser, flag: str, help: str, default: Any = None,
         type: Callable[[str], Any] = str, **kw: Any) -> None:
    dest = flag.lstrip("-").replace("-", "_")
    env = _CLIENT_ENV.get(dest, "QUEICKD_ATTENDANCE_" + dest.upper())
    value = os.environ.get(env)
    if value is not None:
        try:
            default = type(value)
        except (ValueError, argparse.ArgumentTypeError) as e:
            # For `run` (a unit's EnvironmentFile) a bad value is a configuration error: 78.
            if p.prog.endswith(" run"):
                p.print_usage(sys.stderr)
                p.exit(EX_CONFIG, f"{p.prog}: configuration error: {env}={value!r}: {e}\n")
            p.error(f"{env}={value!r}: {e}")
    shown = f" (default: {default})" if default not in (None, "", []) else ""
    p.add_argument(flag, default=default, type=type, help=f"{help}{shown} [env {env}]", **kw)


def _day(text: str) -> str:
    """--date: an ISO date, or 'today' / 'yesterday' (work days, resolved by the report)."""
    t = text.strip().lower()
    if t in ("today", "yesterday"):
        return t
    try:
        return dt.date.fromisoformat(t).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a day: give YYYY-MM-DD, today or yesterday") from None


def _db_flag(p: argparse.ArgumentParser) -> None:
    _opt(p, "--db", "the attendance log (SQLite)", _D.db)


def _targets(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="queick attendance",
        description="An NFC attendance terminal: each card tap becomes a durable punch (in or out) "
        "posted to Slack through queickd. The terminal runs beside the daemon.",
        epilog="Run 'queick attendance COMMAND --help' for a command's flags.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser("run", help="run the terminal", description=(
        "Read cards and turn taps into punches: written to the attendance log first, then posted to "
        "Slack by a queickd job (start the daemon with --allow 'queickd.attendance.*'). Runs until "
        "SIGTERM/SIGINT."))
    _opt(run, "--reader", "nfcpy device path (usb, tty:AMA0:pn532, udp:HOST:PORT) or a line reader "
         "(/dev/ttyUSB0, socket://HOST:PORT, line:URL)", _D.reader)
    _opt(run, "--targets", "nfcpy: card types to poll, comma-separated (212F FeliCa, 106A Type A)",
         ",".join(_D.targets), type=_targets)
    _db_flag(run)
    _opt(run, "--host", "queickd host", _D.host)
    _opt(run, "--port", "queickd port", _D.port, type=int)
    _opt(run, "--token-file", "file holding queickd's token", None)
    _opt(run, "--debounce", "seconds in which the same card again is ignored", _D.debounce, type=float)
    _opt(run, "--day-boundary", "local time a work day starts (night shifts end before it)", _D.day_boundary)
    _opt(run, "--unknown-cards", "post a tap of an unregistered card: once per card, every time, or never",
         _D.unknown_cards, choices=UNKNOWN_POLICIES)
    _opt(run, "--feedback", "command run on every tap with in/out/unknown/ignored/error appended (a beep, an LED)")
    _opt(run, "--slack-channel", "channel to post to (with a bot token)")
    _opt(run, "--slack-token-file", "file holding the bot token (default: the systemd credential "
         "'slack-token' of the daemon)")
    _opt(run, "--slack-webhook-file", "file holding an incoming-webhook URL, instead of a token")
    _opt(run, "--slack-base-url", "Slack Web API base URL, ending in '/' (for a local stand-in)")
    _opt(run, "--late-after", "seconds after which a post says how late it is", _D.late_after, type=float)
    _opt(run, "--slack-rate", "posts a second to one channel at most (Slack allows about one); the queue keeps "
         "the pace", _D.slack_rate, type=float)
    _opt(run, "--daily-summary", "post the day's hours on this cron schedule, e.g. '0 19 * * *'")
    _opt(run, "--post-key", "the serial key of this terminal's posts: its punches post one at a time, in tap "
         "order; give each terminal of a fleet its own (attendance:office-3) where they forward to one "
         "central daemon", _D.post_key)
    _opt(run, "--log-level", "log level", "info", choices=log.LEVELS)

    reg = sub.add_parser("register", help="register a card for a person", description=(
        "Register a card: give its id, take the last unknown card that was tapped on the running "
        "terminal, or tap it now on a reader the terminal is not using."))
    reg.add_argument("--name", required=True, help="the person's name, as posted")
    reg.add_argument("--slack-user", help="the person's Slack user id (U…), to mention them")
    which = reg.add_mutually_exclusive_group(required=True)
    which.add_argument("--card", help="the card id in hex (IDm or UID)")
    which.add_argument("--last-unknown", action="store_true", help="the unknown card tapped most recently")
    which.add_argument("--reader", help="tap the card on this reader now")
    reg.add_argument("--targets", type=_targets, default=_D.targets, help="with --reader: card types to poll")
    reg.add_argument("--timeout", type=float, default=60.0, help="with --reader: seconds to wait for a tap")
    _db_flag(reg)

    cards = sub.add_parser("cards", help="list registered cards", description="List registered cards.")
    cards.add_argument("--unknown", action="store_true", help="list unregistered cards that were tapped")
    cards.add_argument("--json", action="store_true", help="print JSON")
    _db_flag(cards)

    rm = sub.add_parser("remove", help="remove a card", description="Remove a card (its punches stay).")
    rm.add_argument("card", help="the card id in hex")
    _db_flag(rm)

    rep = sub.add_parser("report", help="a day's punches and hours",
                         description="Print one work day's punches and each person's hours.")
    rep.add_argument("--date", type=_day, help="the work day: YYYY-MM-DD, today or yesterday (default: today)")
    _opt(rep, "--day-boundary", "local time a work day starts", _D.day_boundary)
    rep.add_argument("--json", action="store_true", help="print JSON")
    _db_flag(rep)
    return p


def _tap_now(reader_path: str, targets: list[str], timeout: float) -> str:
    from .readers import make_reader

    reader = make_reader(reader_path, targets)
    reader.open()
    stop = threading.Event()
    timer = threading.Timer(timeout, stop.set)
    timer.start()
    try:
        print(f"tap the card on {reader_path} (waiting {timeout:g} s)…", file=sys.stderr)
        card = reader.wait_card(stop)
    finally:
        timer.cancel()
        reader.close()
    if card is None:
        raise TimeoutError(f"no card was tapped within {timeout:g} s")
    return card


def _register(a: argparse.Namespace, plog: PunchLog) -> int:
    if a.last_unknown:
        unknown = plog.unknown()
        if not unknown:
            print("queick attendance: no unknown card has been tapped", file=sys.stderr)
            return 1
        card_id = unknown[0]["card_id"]
    elif a.reader:
        card_id = _tap_now(a.reader, a.targets, a.timeout)
    else:
        card_id = a.card
    card = plog.register(card_id, a.name, a.slack_user)
    print(f"card {card.card_id} registered for {card.name}" + (f" (<@{card.slack_user}>)" if card.slack_user else ""))
    return 0


def _report(a: argparse.Namespace, plog: PunchLog) -> int:
    day = a.date or "today"
    if day in ("today", "yesterday"):
        today = work_day(time.time(), parse_day_boundary(a.day_boundary))
        day = today if day == "today" else (dt.date.fromisoformat(today) - dt.timedelta(days=1)).isoformat()
    punches = plog.punches(day)
    people = day_report(punches)
    if a.json:
        print(json.dumps({"day": day, "punches": [p.to_dict() for p in punches],
                          "people": [{"name": d.name, "seconds": d.seconds, "open": d.open,
                                      "periods": d.periods} for d in people]}))
        return 0
    print(f"work day {day}: {len(punches)} punch(es)")
    for p in punches:
        state = "posted " + local_time(p.posted_at) if p.posted_at else (f"job {p.job_id}" if p.job_id else "not sent")
        flag = f"  (no clock-out on {p.missed_out_day})" if p.missed_out_day else ""
        print(f"  {local_time(p.tapped_at)}  {p.direction:<7}  {p.name or p.card_id:<24}  {state}{flag}")
    for d in people:
        print(f"{d.name}: {span(d.seconds)}" + ("  (still clocked in)" if d.open else ""))
    return 0


def _run(a: argparse.Namespace) -> int:
    fields = {f.name for f in dataclasses.fields(TerminalConfig)}
    config = TerminalConfig(**{k: v for k, v in vars(a).items() if k in fields and v is not None})
    try:
        log.setup(a.log_level)
        terminal = Terminal(config)  # validates the config first
    except (ValueError, OSError) as e:
        print(f"queick attendance: configuration error: {e}", file=sys.stderr)
        return EX_CONFIG
    terminal.run_forever()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.command == "run":
        return _run(a)
    if a.command != "register" and not os.path.exists(a.db):
        # Reading (or removing from) a log that is not there must not create an empty one.
        print(f"queick attendance: there is no attendance log at {a.db} (give --db PATH or set "
              "QUEICKD_ATTENDANCE_DB)", file=sys.stderr)
        return 1
    try:
        with PunchLog(a.db) as plog:
            if a.command == "register":
                return _register(a, plog)
            if a.command == "cards":
                rows = plog.unknown() if a.unknown else [dataclasses.asdict(c) for c in plog.cards()]
                if a.json:
                    print(json.dumps(rows))
                elif a.unknown:
                    for r in rows:
                        print(f"{r['card_id']:<20}  taps {r['taps']:<4}  last {local_time(r['last_at'])}")
                else:
                    for r in rows:
                        print(f"{r['card_id']:<20}  {r['name']:<24}  {r['slack_user'] or '-':<12}  "
                              f"since {local_time(r['registered_at'])}")
                return 0
            if a.command == "remove":
                if plog.remove(a.card):
                    print(f"card {a.card} removed")
                    return 0
                print(f"queick attendance: card {a.card} is not registered", file=sys.stderr)
                return 1
            return _report(a, plog)
    except (ValueError, TimeoutError, OSError) as e:
        print(f"queick attendance: {e}", file=sys.stderr)
        return 1
