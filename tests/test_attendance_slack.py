"""Punches to Slack through a real daemon and slack-sdk, against a local Slack stand-in.

The terminal runs in this process with a serial line reader on socket:// (pyserial's
real code); the daemon is a real subprocess that runs the post jobs."""

from __future__ import annotations

import logging
import random
import re
import threading
import time

import pytest
from attendance_support import ALLOW, CardFeed, RunningTerminal, terminal_config
from helpers import DaemonProcess, Listener
from slackstub import HOLD, STALL, SlackStub

from queickd.attendance import slack as slack_jobs
from queickd.attendance.punchlog import PunchLog, work_day
from queickd.core.job import State
from queickd.run import context

pytest.importorskip("slack_sdk")
pytest.importorskip("serial")

ALICE, BOB, CAROL = "0102030405060708", "08A1B2C3", "0A0B0C0D0E0F1011"


def punch_metadata(punch_id: str) -> dict:
    return {"event_type": "queickd_punch", "event_payload": {"punch_id": punch_id}}


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    # slack-sdk and urllib honour proxy variables; the stand-in is on loopback.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def slack():
    s = SlackStub().start()
    yield s
    s.close()


@pytest.fixture
def feed():
    f = CardFeed()
    yield f
    f.close()


@pytest.fixture
def terminal(tmp_path, feed, slack):
    started: list[RunningTerminal] = []

    def start(daemon: DaemonProcess, port: int | None = None, **kw) -> RunningTerminal:
        kw.setdefault("slack_base_url", slack.base_url)
        t = RunningTerminal(terminal_config(tmp_path, feed.url, port or daemon.port, **kw))
        t.plog.register(ALICE, "Alice", "U0ALICE")
        t.plog.register(BOB, "Bob")
        t.plog.register(CAROL, "Carol")
        started.append(t)
        t.wait_reader_open()
        return t

    yield start
    for t in started:
        t.stop()


def tap_and_post(feed, term, card):
    feed.tap(card)
    tap = term.next_tap()
    assert tap.punch is not None, tap
    return tap.punch


def test_a_tap_is_posted_naming_the_person_direction_and_tap_time(start_daemon, terminal, feed, slack):
    d = start_daemon(None, *ALLOW)
    term = terminal(d)
    punch = tap_and_post(feed, term, ALICE)
    [msg] = slack.wait_posted(1)
    assert msg["path"] == "/api/chat.postMessage"
    assert msg["auth"] == "Bearer xoxb-test-token"
    assert msg["json"]["channel"] == "C0ATTEND"
    tapped = time.strftime("%H:%M:%S", time.localtime(punch.tapped_at))
    assert msg["json"]["text"] == f"<@U0ALICE> (Alice) clocked in at {tapped}."
    assert msg["json"]["metadata"] == punch_metadata(punch.punch_id)
    with d.client() as q:
        job = q.wait(term.job_id(punch.punch_id), 20)
    assert job["state"] == State.SUCCEEDED and job["idempotency_key"] == punch.punch_id
    assert job["retry_on_network"] is True
    assert term.plog.punch(punch.punch_id).slack_ts == msg["ts"]
    assert slack.requests_to("conversations.history") == []  # a first try has nothing to look for


def test_a_named_token_file_gives_the_terminal_its_token_not_the_whole_line(start_daemon, terminal, feed,
                                                                            slack, tmp_path):
    daemon_tokens = tmp_path / "tokens"
    daemon_tokens.write_text("pi1:s3cret-one\nlaptop:s3cret-two\n")
    device_token = tmp_path / "device-token"
    device_token.write_text("pi1:s3cret-one\n")
    d = start_daemon(None, *ALLOW, "--token-file", str(daemon_tokens))
    term = terminal(d, token_file=str(device_token))
    punch = tap_and_post(feed, term, ALICE)
    [msg] = slack.wait_posted(1)
    assert msg["json"]["metadata"] == punch_metadata(punch.punch_id)


def test_taps_toggle_in_and_out_and_post_in_tap_order(start_daemon, terminal, feed, slack):
    d = start_daemon(None, *ALLOW)
    term = terminal(d, debounce=0)
    for card in (ALICE, BOB, ALICE):
        tap_and_post(feed, term, card)
    texts = [m["json"]["text"] for m in slack.wait_posted(3)]
    assert [re.sub(r" at .*", "", t) for t in texts] == [
        "<@U0ALICE> (Alice) clocked in", "Bob clocked in", "<@U0ALICE> (Alice) clocked out"]


def test_a_429_holds_the_posts_for_its_retry_after_and_spends_no_attempt(start_daemon, terminal, feed, slack):
    slack.then((429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "1"}))
    d = start_daemon(None, *ALLOW)
    term = terminal(d)
    punch = tap_and_post(feed, term, BOB)
    slack.wait_posted(1)
    first, second = slack.requests
    assert second["at"] - first["at"] >= 1.0  # not before Slack said
    with d.client() as q:
        job = q.wait(term.job_id(punch.punch_id), 20)
    assert job["state"] == State.SUCCEEDED and job["attempts"] == 1  # no attempt spent on it
    assert job["rate_limit"] == {"key": "slack:C0ATTEND", "limit": 1, "per": slack_jobs.PACE_HEADROOM}
    assert len(slack.posted) == 1


def test_a_burst_of_taps_under_a_rate_limit_is_posted_in_tap_order_spending_no_attempts(
        start_daemon, terminal, feed, slack):
    # The refused post waits in its place, its channel's key blocked: the next one does
    # not go out meanwhile to meet the same limit.
    limited = (429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "1"})
    slack.then(limited, limited)
    d = start_daemon(None, *ALLOW)
    term = terminal(d, debounce=0)
    punches = [tap_and_post(feed, term, card) for card in (ALICE, BOB, CAROL)]
    texts = [m["json"]["text"] for m in slack.wait_posted(3)]
    assert [t.split(" clocked")[0] for t in texts] == ["<@U0ALICE> (Alice)", "Bob", "Carol"]
    with d.client() as q:
        jobs = [q.wait(term.job_id(p.punch_id), 20) for p in punches]
    assert [(j["state"], j["attempts"]) for j in jobs] == [(State.SUCCEEDED, 1)] * 3


def test_a_long_rate_limit_holds_the_post_queued_in_its_place_not_a_worker(start_daemon, terminal, feed, slack):
    slack.then((429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "3600"}))
    d = start_daemon(None, *ALLOW)
    term = terminal(d)
    punch = tap_and_post(feed, term, BOB)
    d.wait_for_line(r"refused for its rate: SlackRateLimitedError")
    with d.client() as q:
        # Logged as the run is judged; back in the queue once the pool's next pass stores it.
        job = q.wait(term.job_id(punch.punch_id), 10, states=[State.QUEUED])
        (key,) = q.stats()["rate_keys"]
    assert (job["state"], job["attempts"], job["error"]["type"]) == (State.QUEUED, 0, "SlackRateLimitedError")
    assert key["key"] == "slack:C0ATTEND" and key["blocked_until"] > time.time() + 3000  # Slack's hour
    assert slack.posted == []


@pytest.mark.long
@pytest.mark.timeout(700)
def test_a_backlog_of_200_punches_reaches_a_rate_limited_slack_in_tap_order_losing_none(
        start_daemon, terminal, feed, slack):
    # Slack takes one post a second and answers 429 (Retry-After: the rest of the pause) to
    # any sooner, as its chat.postMessage does per channel; the terminal's posts keep that
    # pace through the queue's rate limit (with its headroom), and a post delayed on its way
    # more than the headroom still meets a 429. At Slack's own pace: 210 s and more.
    slack.post_every = 1.0
    d = start_daemon(None, *ALLOW, workers=4)
    term = terminal(d, debounce=0, slack_rate=1.0)
    cards = [(ALICE, BOB, CAROL)[i % 3] for i in range(200)]
    punches = [tap_and_post(feed, term, card) for card in cards]
    posted = slack.wait_posted(200, timeout=600)
    assert [m["json"]["metadata"]["event_payload"]["punch_id"] for m in posted] == [p.punch_id for p in punches]
    with d.client() as q:
        jobs = [q.wait(term.job_id(p.punch_id), 30) for p in punches]
    assert {(j["state"], j["attempts"]) for j in jobs} == {(State.SUCCEEDED, 1)}  # no attempt burned


def test_a_503_while_the_network_is_up_is_retried_and_looked_for_before_posting_again(
        start_daemon, terminal, feed, slack):
    # Network-class, but the checker says the network is up: Slack's own trouble, so the
    # retry policy (its attempt spent), not a park released at every sweep for ever.
    internet = Listener()
    slack.then((503, "Service Unavailable"))
    d = start_daemon(None, *ALLOW, "--ping-host", f"127.0.0.1:{internet.port}", "--ping-interval", "0.1")
    try:
        d.wait_for_line("network is up")
        term = terminal(d)
        punch = tap_and_post(feed, term, BOB)
        term.wait_sent(1)
        with d.client() as q:
            job = q.wait(term.job_id(punch.punch_id), 30)
        assert (job["state"], job["attempts"]) == (State.SUCCEEDED, 2)
        assert len(slack.wait_posted(1)) == 1 and len(slack.requests_to("chat.postMessage")) == 2
        # A 503 may come after Slack took the post: the second try looked for it first.
        assert len(slack.requests_to("conversations.history")) == 1
    finally:
        internet.close()


@pytest.mark.parametrize("error", ["invalid_auth", "channel_not_found"])
def test_a_post_slack_refuses_for_good_is_a_dead_letter_at_once(start_daemon, terminal, feed, slack, error):
    slack.then((200, {"ok": False, "error": error}))
    d = start_daemon(None, *ALLOW)
    term = terminal(d)
    punch = tap_and_post(feed, term, ALICE)
    term.wait_sent(1)
    with d.client() as q:
        job = q.wait(term.job_id(punch.punch_id), 20)
        assert job["state"] == State.DEAD and job["attempts"] == 1
        assert job["error"]["type"] == "SlackRejectedError" and error in job["error"]["message"]
        assert [j["id"] for j in q.dead()["jobs"]] == [job["id"]]
    assert slack.posted == [] and term.plog.punch(punch.punch_id).posted_at is None


def test_an_outage_parks_every_post_and_replays_one_message_per_punch_in_tap_order(
        start_daemon, terminal, feed, slack):
    internet = Listener()
    d = start_daemon(None, *ALLOW, "--ping-host", f"127.0.0.1:{internet.port}", "--ping-interval", "0.1",
                     workers=2)
    try:
        d.wait_for_line("network is up")
        term = terminal(d, debounce=0, late_after=0)  # every post says how late it is
        port = slack.port
        slack.close()  # Slack refuses connections ...
        internet.close()  # ... and the checker sees the network go
        d.wait_for_line("network is down")
        punches = [tap_and_post(feed, term, card) for card in (ALICE, BOB, CAROL, ALICE)]
        term.wait_sent(4)
        with d.client() as q:
            for p in punches:
                job = q.wait(term.job_id(p.punch_id), 20, states=[State.WAITING_NETWORK])
                assert job["attempts"] == 0
            slack.start(port)
            internet.open()
            for p in punches:
                assert q.wait(term.job_id(p.punch_id), 30)["state"] == State.SUCCEEDED
        posted = slack.wait_posted(4)
        assert [re.sub(r" at .*", "", m["json"]["text"]) for m in posted] == [
            "<@U0ALICE> (Alice) clocked in", "Bob clocked in", "Carol clocked in", "<@U0ALICE> (Alice) clocked out"]
        assert len(slack.requests) == 4
        assert all("late: the network or Slack was unavailable" in m["json"]["text"] for m in posted)
    finally:
        internet.close()


def test_posts_through_an_incoming_webhook(start_daemon, terminal, feed, slack, tmp_path):
    hook = tmp_path / "webhook"
    hook.write_text(slack.webhook_url + "\n")
    d = start_daemon(None, *ALLOW)
    term = terminal(d, slack_token_file=None, slack_channel=None, slack_base_url=None, slack_webhook_file=str(hook))
    tap_and_post(feed, term, BOB)
    [msg] = slack.wait_posted(1)
    assert msg["path"] == "/services/T000/B000/XXXX" and msg["json"]["text"].startswith("Bob clocked in at ")


def test_a_daemon_killed_between_tap_and_post_posts_the_punch_once_after_restart(
        start_daemon, terminal, feed, slack, db_url):
    slack.then(HOLD)  # the first post reaches Slack's door and gets no answer
    d = start_daemon(db_url, *ALLOW)
    term = terminal(d)
    punch = tap_and_post(feed, term, CAROL)
    slack.wait_request()
    d.kill()  # kill -9 with the post in flight
    slack.release()
    d2 = start_daemon(db_url, *ALLOW)
    with d2.client() as q:
        job = q.wait(term.job_id(punch.punch_id), 30)
    assert job["state"] == State.SUCCEEDED and job["orphaned"] == 1
    [msg] = slack.wait_posted(1)
    assert msg["json"]["text"].startswith("Carol clocked in at ")
    assert len(slack.posted) == 1
    assert len(slack.requests_to("conversations.history")) == 1  # looked, did not find it, posted


def kill_with_a_post_in_flight(start_daemon, terminal, feed, slack, db_url, answer, **terminal_kw):
    """Tap, let the post reach the Slack stand-in (which answers `answer`: HOLD or STALL),
    kill -9 the daemon while the job waits for Slack's answer, restart it on the same
    store. Returns the punch, the terminal and the restarted daemon."""
    slack.then(answer)
    d = start_daemon(db_url, *ALLOW)
    term = terminal(d, **terminal_kw)
    punch = tap_and_post(feed, term, CAROL)
    slack.wait_request()
    d.kill()
    slack.release()  # the held answer is never read: its reader is dead
    return punch, term, start_daemon(db_url, *ALLOW)


def test_a_post_slack_took_before_the_daemon_was_killed_is_found_and_not_posted_again(
        start_daemon, terminal, feed, slack, db_url):
    punch, term, d = kill_with_a_post_in_flight(start_daemon, terminal, feed, slack, db_url, STALL)
    [msg] = slack.posted  # Slack has it; the job never heard back
    with d.client() as q:
        job = q.wait(term.job_id(punch.punch_id), 30)
    assert job["state"] == State.SUCCEEDED and job["orphaned"] == 1
    assert job["result"] == {"posted": False, "reason": "found in Slack", "ts": msg["ts"]}
    assert len(slack.requests_to("chat.postMessage")) == 1 and len(slack.posted) == 1
    [lookup] = slack.requests_to("conversations.history")
    assert lookup["json"]["include_all_metadata"] in ("1", "true")
    assert float(lookup["json"]["oldest"]) < punch.tapped_at
    assert term.plog.punch(punch.punch_id).slack_ts == msg["ts"]


def test_without_the_history_scope_a_maybe_posted_punch_is_posted_with_a_warning(
        start_daemon, terminal, feed, slack, db_url):
    slack.history_error = "missing_scope"
    punch, term, d = kill_with_a_post_in_flight(start_daemon, terminal, feed, slack, db_url, HOLD)
    with d.client() as q:
        job = q.wait(term.job_id(punch.punch_id), 30)
    assert job["state"] == State.SUCCEEDED and job["result"]["posted"] is True
    d.wait_for_line(rf"punch {punch.punch_id}: an earlier post may have reached Slack, but the token cannot "
                    r"read C0ATTEND's history .*missing_scope.* give the Slack app the scope channels:history")
    [msg] = slack.wait_posted(1)
    assert msg["json"]["metadata"] == punch_metadata(punch.punch_id)
    assert len(slack.requests_to("conversations.history")) == 1


def test_through_a_webhook_a_post_slack_took_before_the_kill_is_posted_again_with_a_warning(
        start_daemon, terminal, feed, slack, db_url, tmp_path):
    # The documented limit: a webhook cannot be asked what it posted.
    hook = tmp_path / "webhook"
    hook.write_text(slack.webhook_url + "\n")
    punch, term, d = kill_with_a_post_in_flight(
        start_daemon, terminal, feed, slack, db_url, STALL,
        slack_token_file=None, slack_channel=None, slack_base_url=None, slack_webhook_file=str(hook))
    with d.client() as q:
        assert q.wait(term.job_id(punch.punch_id), 30)["state"] == State.SUCCEEDED
    d.wait_for_line(rf"punch {punch.punch_id}: an earlier post may have reached Slack, and an incoming "
                    "webhook cannot be asked; posting it again")
    assert len(slack.wait_posted(2)) == 2


def test_the_lookup_pages_back_newest_first_and_stops_at_its_bound(slack, tmp_path, monkeypatch, caplog):
    token = tmp_path / "token"
    token.write_text("xoxb-test-token\n")
    target = slack_jobs.SlackTarget(channel="C0ATTEND", token_file=str(token), base_url=slack.base_url)
    since = time.time() - 60
    for n in range(5):
        slack_jobs.send(target, f"message {n}", punch_metadata(f"punch-{n}"))
    monkeypatch.setattr(slack_jobs, "LOOKUP_PAGE", 2)
    monkeypatch.setattr(slack_jobs, "LOOKUP_PAGES", 2)
    assert slack_jobs.find_punch(target, "punch-1", since) == slack.posted[1]["ts"]  # on the second page
    assert slack_jobs.find_punch(target, "punch-0", since) is None  # beyond four messages back
    assert "punch punch-0: not among the newest 4 messages of C0ATTEND" in caplog.text
    assert slack_jobs.find_punch(target, "punch-4", float(slack.posted[4]["ts"])) is None  # older than `since`


def test_a_punch_tapped_while_the_daemon_is_down_is_posted_once_it_is_back(
        start_daemon, terminal, feed, slack, db_url):
    # On a loopback address of its own: while its daemon is down the terminal keeps trying
    # the port, which another test's daemon on 127.0.0.1 may have been given meanwhile.
    host = f"127.0.0.{random.randint(2, 254)}"
    d = start_daemon(db_url, "--bind", host, *ALLOW)
    port = d.port
    assert d.terminate() == 0
    d = DaemonProcess(db_url, "--bind", host, "--port", str(port), *ALLOW)  # same address and port, later
    term = terminal(d, port=port, host=host)
    punch = tap_and_post(feed, term, ALICE)
    assert term.plog.punch(punch.punch_id).job_id is None  # safe in the log, not yet handed over
    d.start()
    try:
        term.wait_sent(1, timeout=30)
        [msg] = slack.wait_posted(1)
        assert msg["json"]["text"].startswith("<@U0ALICE> (Alice) clocked in at ")
    finally:
        d.close()


def test_the_daily_summary_job_posts_each_persons_hours(start_daemon, terminal, feed, slack):
    d = start_daemon(None, *ALLOW)
    term = terminal(d, debounce=0)
    for card in (ALICE, BOB, ALICE):
        tap_and_post(feed, term, card)
    slack.wait_posted(3)
    cfg = term.terminal.config
    with d.client() as q:
        job_id = q.enqueue("queickd.attendance.slack:post_daily_summary",
                           [cfg.db, cfg.slack.to_dict(), 4 * 60])
        assert q.wait(job_id, 20)["state"] == State.SUCCEEDED
    summary = slack.wait_posted(4)[-1]["json"]["text"]
    assert summary.startswith("Attendance ") and "• Alice: " in summary and "• Bob: " in summary
    assert "Bob: 0 s" in summary and "(no clock-out yet)" in summary


def test_a_daily_summary_that_runs_late_posts_the_day_its_tick_fell_in(slack, tmp_path):
    token = tmp_path / "token"
    token.write_text("xoxb-test-token\n")
    target = slack_jobs.SlackTarget(channel="C0ATTEND", token_file=str(token), base_url=slack.base_url)
    tick = time.time() - 2 * 86400  # fired two days ago: the daemon was off, or the network down
    tokens = context.set_job(context.CurrentJob(1, 1, None, None, (tick, tick)))  # as a runner sets it around a cron's run
    try:
        out = slack_jobs.post_daily_summary(str(tmp_path / "attendance.db"), target.to_dict(), 4 * 60)
    finally:
        context.reset_job(tokens)
    assert out["day"] == work_day(tick, 4 * 60) != work_day(time.time(), 4 * 60)
    assert out["day"] in slack.wait_posted(1)[-1]["json"]["text"]


def test_a_daily_summary_held_back_past_later_ticks_posts_each_of_their_days(slack, tmp_path):
    token = tmp_path / "token"
    token.write_text("xoxb-test-token\n")
    target = slack_jobs.SlackTarget(channel="C0ATTEND", token_file=str(token), base_url=slack.base_url)
    tick = time.time() - 3 * 86400  # the network down for three days: two more ticks folded into it
    tokens = context.set_job(context.CurrentJob(1, 1, None, None, (tick, tick + 2 * 86400)))
    try:
        out = slack_jobs.post_daily_summary(str(tmp_path / "attendance.db"), target.to_dict(), 4 * 60)
    finally:
        context.reset_job(tokens)
    days = [work_day(tick + i * 86400, 4 * 60) for i in range(3)]
    assert (out["day"], out["days"]) == (days[0], days)
    text = slack.wait_posted(1)[-1]["json"]["text"]
    assert [text.index(f"Attendance {d}") for d in days] == sorted(text.index(f"Attendance {d}") for d in days)


def test_summaries_of_many_days_go_in_messages_of_whole_days_under_slacks_advised_length():
    days = [f"Attendance 2026-11-{d:02d}:\n" + "\n".join(f"• Person {p}: 8 h" for p in range(60)) for d in range(1, 8)]
    messages = slack_jobs.summary_messages(days)
    assert len(messages) > 1 and all(len(m) <= slack_jobs.SUMMARY_MESSAGE_CHARS for m in messages)
    assert "\n\n".join(messages).split("\n\n") == days  # every day whole, in order


def test_a_day_longer_than_slacks_advised_length_goes_whole_in_its_own_message():
    long_day, short = "x" * (slack_jobs.SUMMARY_MESSAGE_CHARS + 1), "Attendance 2026-11-02: nobody clocked in."
    assert slack_jobs.summary_messages([short, long_day, short]) == [short, long_day, short]


class LogWaiter(logging.Handler):
    """Sets `seen` when a record containing `text` is logged."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.seen = text, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


def test_a_daemon_that_does_not_allow_the_post_job_says_how_to_fix_it_and_the_punch_waits(
        start_daemon, terminal, feed, slack):
    d = start_daemon()  # no --allow 'queickd.attendance.*'
    waiter = LogWaiter("start the daemon with --allow 'queickd.attendance.*'")
    logging.getLogger("queickd.attendance").addHandler(waiter)
    try:
        term = terminal(d)
        punch = tap_and_post(feed, term, ALICE)
        assert waiter.seen.wait(20)
        assert [p.punch_id for p in term.plog.unsent()] == [punch.punch_id]
    finally:
        logging.getLogger("queickd.attendance").removeHandler(waiter)


def test_punches_left_unsent_by_a_terminal_that_died_are_posted_by_the_next_one(
        start_daemon, terminal, feed, slack, tmp_path):
    # A terminal killed after the commit and before the hand-over leaves this behind.
    with PunchLog(str(tmp_path / "attendance.db"), debounce=0) as plog:
        plog.register(BOB, "Bob")
        left = [plog.record_tap(BOB).punch for _ in range(2)]
    d = start_daemon(None, *ALLOW)
    term = terminal(d)
    term.wait_sent(2)
    texts = [m["json"]["text"] for m in slack.wait_posted(2)]
    assert [t.split(" at ")[0] for t in texts] == ["Bob clocked in", "Bob clocked out"]
    with d.client() as q:
        assert [q.wait(term.job_id(p.punch_id), 20)["state"] for p in left] == [State.SUCCEEDED] * 2
    assert [term.plog.punch(p.punch_id).posted_at is not None for p in left] == [True, True]
