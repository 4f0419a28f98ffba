"""`queick attendance`: the registry commands, the report, and the terminal as a process."""

from __future__ import annotations

import datetime as dt
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading

import pytest
from attendance_support import ALLOW, CardFeed
from slackstub import SlackStub

from queickd.attendance import cli
from queickd.attendance.punchlog import PunchLog

ALICE, STRANGER = "0102030405060708", "DEADBEEF"


def queick(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "queickd", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def attendance(capsys):
    """`queick attendance ARGS` in this process (the registry commands are plain SQLite)."""

    def run(*args: str) -> subprocess.CompletedProcess:
        try:
            code = cli.main(list(args))
        except SystemExit as e:
            code = e.code
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    return run


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "attendance.db")


@pytest.fixture
def slack_options(tmp_path):
    """`run` options for a Slack channel with a bot token file, and a reader (never opened)."""
    token = tmp_path / "t"
    token.write_text("xoxb")
    return ["--reader", "socket://127.0.0.1:9", "--slack-channel", "C", "--slack-token-file", str(token)]


def test_queick_help_lists_the_attendance_command():
    assert "attendance" in queick("--help").stdout
    out = queick("attendance", "--help").stdout
    assert all(c in out for c in ("register", "cards", "remove", "report", "run"))


def test_register_list_and_remove_a_card(attendance, db):
    r = attendance("register", "--db", db, "--card", "01:02:03:04:05:06:07:08", "--name", "Alice",
               "--slack-user", "U0ALICE")
    assert r.returncode == 0 and f"card {ALICE} registered for Alice" in r.stdout
    cards = json.loads(attendance("cards", "--db", db, "--json").stdout)
    assert [(c["card_id"], c["name"], c["slack_user"]) for c in cards] == [(ALICE, "Alice", "U0ALICE")]
    assert attendance("remove", "--db", db, ALICE).returncode == 0
    again = attendance("remove", "--db", db, ALICE)
    assert again.returncode == 1 and "not registered" in again.stderr


def test_register_refuses_a_card_id_that_is_not_hex(attendance, db):
    r = attendance("register", "--db", db, "--card", "xyz", "--name", "Alice")
    assert r.returncode == 1 and "not a card id" in r.stderr


def test_register_the_last_unknown_card_tapped(attendance, db):
    with PunchLog(db) as plog:
        plog.record_tap(STRANGER)
    assert STRANGER in attendance("cards", "--db", db, "--unknown").stdout
    r = attendance("register", "--db", db, "--last-unknown", "--name", "Carol")
    assert r.returncode == 0 and f"card {STRANGER} registered for Carol" in r.stdout
    assert attendance("cards", "--db", db, "--unknown").stdout == ""


def test_report_prints_the_days_punches_and_hours(attendance, db):
    with PunchLog(db, debounce=0) as plog:
        plog.register(ALICE, "Alice")
        t0 = 1_764_486_000.0  # a Sunday morning in Tokyo; the report is asked for by date
        first = plog.record_tap(ALICE, t0).punch
        plog.record_tap(ALICE, t0 + 2 * 3600)
    out = json.loads(attendance("report", "--db", db, "--date", first.day, "--json").stdout)
    assert [p["direction"] for p in out["punches"]] == ["in", "out"]
    assert out["people"] == [{"name": "Alice", "seconds": 7200.0, "open": False, "periods": [[t0, t0 + 7200]]}]
    text = attendance("report", "--db", db, "--date", first.day).stdout
    assert "Alice: 2 h 00 min" in text and "not sent" in text


def test_run_without_a_reader_is_a_configuration_error(attendance, db):
    r = attendance("run", "--db", db)
    assert r.returncode == 78 and "give a reader" in r.stderr


def test_run_refuses_a_slack_base_url_without_a_trailing_slash(attendance, db, slack_options):
    r = attendance("run", "--db", db, *slack_options, "--slack-base-url", "http://127.0.0.1:9/api")
    assert r.returncode == 78 and "must end in '/'" in r.stderr


def test_run_refuses_a_daily_summary_that_is_not_a_cron_expression(attendance, db, slack_options):
    r = attendance("run", "--db", db, *slack_options, "--daily-summary", "0 25 * * *")
    assert r.returncode == 78 and "hour field '25' is outside 0-23" in r.stderr


class Lines:
    """Collects a subprocess's stderr lines; wait() for one that matches."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            self.lines.append(line)
            self._q.put(line)
        self._q.put(None)

    def wait(self, pattern: str, timeout: float = 20) -> re.Match:
        rx = re.compile(pattern)
        for line in list(self.lines):
            if m := rx.search(line):
                return m
        while True:
            line = self._q.get(timeout=timeout)
            if line is None:
                raise AssertionError(f"exited before logging {pattern!r}:\n{''.join(self.lines)}")
            if m := rx.search(line):
                return m


def test_the_terminal_process_posts_taps_runs_feedback_registers_the_summary_and_stops_on_sigterm(
        start_daemon, db, tmp_path, monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    slack, feed = SlackStub().start(), CardFeed()
    token, beeps = tmp_path / "slack-token", tmp_path / "beeps"
    token.write_text("xoxb-cli\n")
    with PunchLog(db) as plog:
        plog.register(ALICE, "Alice")
    d = start_daemon(None, *ALLOW)
    beep = f"{sys.executable} -c \"import sys; open(sys.argv[1], 'a').write(sys.argv[2] + chr(10))\" {beeps}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "queickd", "attendance", "run", "--reader", feed.url, "--db", db,
         "--port", str(d.port), "--slack-channel", "C0CLI", "--slack-token-file", str(token),
         "--slack-base-url", slack.base_url, "--feedback", beep, "--daily-summary", "0 19 * * *",
         "--log-level", "debug"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        log = Lines(proc)
        log.wait(r"reader socket://\S+ open")
        log.wait("daily summary registered")
        feed.tap(ALICE)
        feed.tap(STRANGER)
        feed.tap(ALICE)  # inside the debounce
        log.wait(r"tap of card \w+ \(Alice\) ignored")
        texts = [m["json"]["text"] for m in slack.wait_posted(2)]
        assert texts[0].startswith("Alice clocked in at ") and texts[1].startswith(f"Unknown card {STRANGER}")
        with d.client() as q:
            assert [c["name"] for c in q.crons()] == ["attendance:daily-summary"]
        for result in ("in", "unknown", "ignored"):
            log.wait(rf"feedback command \S+ done: {result}")
        assert sorted(beeps.read_text().split()) == ["ignored", "in", "unknown"]
        proc.send_signal(signal.SIGHUP)  # as the daemon, a reload, not a stop
        log.wait("SIGHUP: the attendance terminal has nothing to reload")
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        feed.close()
        slack.close()


def test_register_a_card_by_tapping_it_on_a_reader(attendance, db):
    pytest.importorskip("nfc")
    from pn532sim import PN532Simulator

    sim = PN532Simulator()
    try:
        sim.present(ALICE)  # already on the reader when the command starts
        r = attendance("register", "--db", db, "--reader", f"tty:{sim.path}:pn532", "--targets", "212F",
                       "--name", "Alice", "--timeout", "10")
    finally:
        sim.close()
    assert r.returncode == 0 and f"card {ALICE} registered for Alice" in r.stdout
    assert "tap the card" in r.stderr


def test_report_without_a_log_says_there_is_none_and_creates_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "QUEICKD_ATTENDANCE_DB"}
    r = subprocess.run([sys.executable, "-m", "queickd", "attendance", "report"], capture_output=True,
                       text=True, timeout=30, cwd=tmp_path, env=env)
    assert r.returncode == 1 and "there is no attendance log at attendance.db" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_report_yesterday_is_the_work_day_before_today(attendance, db):
    PunchLog(db).close()
    today = json.loads(attendance("report", "--db", db, "--date", "today", "--json").stdout)["day"]
    yesterday = json.loads(attendance("report", "--db", db, "--date", "yesterday", "--json").stdout)["day"]
    assert dt.date.fromisoformat(today) - dt.date.fromisoformat(yesterday) == dt.timedelta(days=1)


def test_report_refuses_a_date_it_cannot_read(attendance, db):
    PunchLog(db).close()
    r = attendance("report", "--db", db, "--date", "last week")
    assert r.returncode == 2 and "'last week' is not a day: give YYYY-MM-DD, today or yesterday" in r.stderr
