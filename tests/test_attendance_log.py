"""The attendance log decides what a tap means: toggle, debounce, work day, unknown cards."""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import time

import pytest

from queickd.attendance.message import day_report, punch_text, summary_text
from queickd.attendance.punchlog import (
    ACCEPTED,
    IGNORED,
    IN,
    OUT,
    UNKNOWN,
    PunchLog,
    normalize_card_id,
    parse_day_boundary,
    work_day,
)

ALICE, BOB, STRANGER = "0102030405060708", "08A1B2C3", "DEADBEEF"


@pytest.fixture(autouse=True)
def _tokyo(monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # no DST: local times in the tests are exact
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def at(text: str) -> float:
    """'2026-11-30 09:00' local → unix time."""
    return time.mktime(dt.datetime.strptime(text, "%Y-%m-%d %H:%M").timetuple())


@pytest.fixture
def plog(tmp_path):
    with PunchLog(str(tmp_path / "a.db"), debounce=60) as log:
        log.register(ALICE, "Alice", "U0ALICE")
        log.register(BOB, "Bob")
        yield log


def test_card_ids_are_normalized_to_upper_hex():
    assert normalize_card_id(" 01:2e:4c-aa ") == "012E4CAA"
    with pytest.raises(ValueError, match="not a card id"):
        normalize_card_id("hello")


def test_the_first_tap_of_the_day_is_in_and_the_next_out(plog):
    taps = [plog.record_tap(ALICE, at(t)) for t in ("2026-11-30 09:00", "2026-11-30 18:00", "2026-11-30 18:30")]
    assert [t.punch.direction for t in taps] == [IN, OUT, IN]
    assert len({t.punch.punch_id for t in taps}) == 3


def test_each_person_toggles_on_their_own(plog):
    a = plog.record_tap(ALICE, at("2026-11-30 09:00"))
    b = plog.record_tap(BOB, at("2026-11-30 09:00"))
    assert (a.punch.direction, b.punch.direction) == (IN, IN)


def test_two_cards_of_one_person_toggle_together(plog):
    plog.register("AABBCCDD", "Alice")
    plog.record_tap(ALICE, at("2026-11-30 09:00"))
    assert plog.record_tap("AABBCCDD", at("2026-11-30 18:00")).punch.direction == OUT


def test_the_same_card_inside_the_debounce_is_ignored_and_not_logged(plog):
    plog.record_tap(ALICE, at("2026-11-30 09:00"))
    again = plog.record_tap(ALICE, at("2026-11-30 09:00") + 59)
    assert again.outcome == IGNORED and again.punch is None and "debounce" in again.reason
    assert len(plog.punches()) == 1
    assert plog.record_tap(ALICE, at("2026-11-30 09:00") + 61).punch.direction == OUT


def test_a_night_shift_before_the_day_boundary_belongs_to_the_day_before(plog):
    start = plog.record_tap(ALICE, at("2026-11-30 22:00"))
    end = plog.record_tap(ALICE, at("2026-12-01 03:30"))
    assert (start.punch.day, end.punch.day) == ("2026-11-30", "2026-11-30")
    assert end.punch.direction == OUT and end.punch.missed_out_day is None


def test_the_day_boundary_is_configurable():
    assert parse_day_boundary("06:30") == 390
    assert work_day(at("2026-12-01 06:00"), 390) == "2026-11-30"
    assert work_day(at("2026-12-01 06:30"), 390) == "2026-12-01"
    with pytest.raises(ValueError):
        parse_day_boundary("25:00")


def test_a_forgotten_clock_out_is_flagged_on_the_next_days_first_punch(plog):
    plog.record_tap(ALICE, at("2026-11-30 09:00"))  # in, never out
    next_day = plog.record_tap(ALICE, at("2026-12-01 09:00"))
    assert next_day.punch.direction == IN and next_day.punch.missed_out_day == "2026-11-30"
    assert plog.record_tap(ALICE, at("2026-12-01 18:00")).punch.missed_out_day is None


def test_an_unknown_card_is_posted_once_by_default(plog):
    first = plog.record_tap(STRANGER, at("2026-11-30 09:00"))
    later = plog.record_tap(STRANGER, at("2026-11-30 10:00"))
    assert first.outcome == ACCEPTED and first.punch.direction == UNKNOWN and first.punch.name is None
    assert later.punch is None
    assert [(u["card_id"], u["taps"]) for u in plog.unknown()] == [(STRANGER, 2)]


@pytest.mark.parametrize(("policy", "posted"), [("every", 2), ("never", 0)])
def test_unknown_cards_policy(tmp_path, policy, posted):
    with PunchLog(str(tmp_path / "a.db"), unknown_cards=policy) as log:
        log.record_tap(STRANGER, at("2026-11-30 09:00"))
        log.record_tap(STRANGER, at("2026-11-30 10:00"))
        assert len(log.punches()) == posted


def test_registering_an_unknown_card_makes_its_next_tap_a_punch(plog):
    plog.record_tap(STRANGER, at("2026-11-30 09:00"))
    plog.register(STRANGER, "Carol")
    assert plog.unknown() == []
    assert plog.record_tap(STRANGER, at("2026-11-30 09:05")).punch.name == "Carol"


def test_a_card_registered_right_after_its_unknown_tap_punches_at_once(plog):
    # The tap that showed the card as unknown is no punch of the person's: no debounce.
    plog.record_tap(STRANGER, at("2026-11-30 09:00"))
    plog.register(STRANGER, "Carol")
    tap = plog.record_tap(STRANGER, at("2026-11-30 09:00") + 10)
    assert tap.outcome == ACCEPTED and (tap.punch.name, tap.punch.direction) == ("Carol", IN)


def test_a_removed_card_is_unknown_but_its_punches_stay(plog):
    plog.record_tap(BOB, at("2026-11-30 09:00"))
    assert plog.remove(BOB) and not plog.remove(BOB)
    assert plog.record_tap(BOB, at("2026-11-30 10:00")).reason == "unknown card"
    assert plog.punches()[0].name == "Bob"


def test_punches_stay_unsent_in_tap_order_until_marked(plog):
    p1 = plog.record_tap(ALICE, at("2026-11-30 09:00")).punch
    p2 = plog.record_tap(BOB, at("2026-11-30 09:01")).punch
    assert [p.punch_id for p in plog.unsent()] == [p1.punch_id, p2.punch_id]
    plog.mark_enqueued(p1.punch_id, 41)
    assert [p.punch_id for p in plog.unsent()] == [p2.punch_id]


def test_a_punch_survives_reopening_the_log(tmp_path):
    path = str(tmp_path / "a.db")
    with PunchLog(path) as log:
        log.register(ALICE, "Alice")
        punch = log.record_tap(ALICE, at("2026-11-30 09:00")).punch
    with PunchLog(path) as log:
        assert log.punch(punch.punch_id) == punch and os.path.getsize(path) > 0


def test_the_message_names_the_person_direction_and_tap_time(plog):
    p = plog.record_tap(ALICE, at("2026-11-30 09:00")).punch
    assert punch_text(p, posted_at=p.tapped_at + 2) == "<@U0ALICE> (Alice) clocked in at 09:00:00."


def test_a_late_post_says_how_late_and_on_which_day_it_was_tapped(plog):
    p = plog.record_tap(BOB, at("2026-11-30 18:00")).punch
    text = punch_text(p, posted_at=at("2026-12-01 09:12"))
    assert text.startswith("Bob clocked in at 18:00:00 on 2026-11-30.")
    assert "Posted 15 h 12 min late" in text


def test_the_message_flags_a_forgotten_clock_out(plog):
    plog.record_tap(BOB, at("2026-11-30 09:00"))
    p = plog.record_tap(BOB, at("2026-12-01 09:00")).punch
    assert "No clock-out was recorded on 2026-11-30" in punch_text(p, p.tapped_at)


def test_an_unknown_card_message_says_how_to_register_it(plog):
    p = plog.record_tap(STRANGER, at("2026-11-30 09:00")).punch
    assert f"attendance register --card {STRANGER}" in punch_text(p, p.tapped_at)


def test_the_day_report_pairs_ins_and_outs_and_sums_hours(plog):
    for card, t in ((ALICE, "09:00"), (BOB, "10:00"), (ALICE, "12:00"), (ALICE, "13:00"), (ALICE, "17:30")):
        plog.record_tap(card, at(f"2026-11-30 {t}"))
    report = {d.name: d for d in day_report(plog.punches("2026-11-30"))}
    assert report["Alice"].seconds == 7.5 * 3600 and not report["Alice"].open
    assert report["Bob"].open
    text = summary_text("2026-11-30", list(report.values()))
    assert "Alice: 7 h 30 min (09:00–12:00, 13:00–17:30)" in text and "Bob: 0 s (10:00–…) (no clock-out yet)" in text


def test_a_punch_whose_post_was_begun_and_never_ended_is_maybe_posted(plog):
    punch = plog.record_tap(ALICE, at("2026-11-30 09:00")).punch
    assert plog.begin_post(punch.punch_id).maybe_posted is False  # the first try
    assert plog.begin_post(punch.punch_id).maybe_posted is True  # the first try's outcome was lost
    plog.post_not_sent(punch.punch_id)  # Slack answered with an error: nothing was posted
    assert plog.begin_post(punch.punch_id).maybe_posted is False
    plog.mark_posted(punch.punch_id, "1796000000.000100")
    assert plog.punch(punch.punch_id).maybe_posted is False


def test_a_log_from_before_the_post_mark_gains_it_and_keeps_its_punches(tmp_path):
    path = str(tmp_path / "old.db")
    with PunchLog(path) as log:
        log.register(BOB, "Bob")
        old = log.record_tap(BOB).punch
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE punches DROP COLUMN posting_at")  # as the log was written before
    db.commit()
    db.close()
    with PunchLog(path) as log:
        assert log.punch(old.punch_id).posting_at is None
        assert log.begin_post(old.punch_id).maybe_posted is False
        assert log.punch(old.punch_id).posting_at is not None
