"""Unit tests for queickd.core.cron: cron expressions, fixed intervals and the SchedulingTime builder.

CronExpr reads times in the process's local time (datetime.fromtimestamp), so expected
instants are built with datetime(...).timestamp() in local time too. The dates are chosen
away from daylight-saving transitions.
"""

from __future__ import annotations

import math
import time
from datetime import datetime

import pytest

from queickd.core.cron import CronExpr, Every, SchedulingTime, parse_schedule, schedule_to_dict


def ts(year, month, day, hour=0, minute=0, second=0, microsecond=0) -> float:
    """Unix time of a naive local datetime."""
    return datetime(year, month, day, hour, minute, second, microsecond).timestamp()


# --- CronExpr.parse: fields -----------------------------------------------------------------


def test_parse_star_covers_the_whole_range_of_each_field():
    c = CronExpr.parse("* * * * *")
    assert c.minutes == frozenset(range(60))
    assert c.hours == frozenset(range(24))
    assert c.days == frozenset(range(1, 32))
    assert c.months == frozenset(range(1, 13))
    assert c.weekdays == frozenset(range(7))


def test_parse_single_values_go_to_their_fields_in_order():
    c = CronExpr.parse("5 4 3 2 1")
    assert (c.minutes, c.hours, c.days, c.months, c.weekdays) == (
        {5}, {4}, {3}, {2}, {1},
    )


def test_parse_range_is_inclusive():
    assert CronExpr.parse("10-13 * * * *").minutes == {10, 11, 12, 13}


def test_parse_step_on_star_starts_at_the_field_low():
    assert CronExpr.parse("*/15 * * * *").minutes == {0, 15, 30, 45}


def test_parse_step_on_star_in_day_of_month_starts_at_one():
    assert CronExpr.parse("0 0 */10 * *").days == {1, 11, 21, 31}


def test_parse_step_on_range_stays_within_the_range():
    assert CronExpr.parse("0 1-10/3 * * *").hours == {1, 4, 7, 10}


def test_parse_step_after_a_single_value_runs_to_the_field_high():
    assert CronExpr.parse("5/15 * * * *").minutes == {5, 20, 35, 50}


def test_parse_list_unites_its_parts():
    assert CronExpr.parse("0,30,45-47 * * * *").minutes == {0, 30, 45, 46, 47}


def test_parse_month_names_map_to_one_based_months():
    assert CronExpr.parse("0 0 1 jan,Mar,DEC *").months == {1, 3, 12}


def test_parse_month_name_range():
    assert CronExpr.parse("0 0 1 jun-aug *").months == {6, 7, 8}


def test_parse_day_names_map_to_zero_based_weekdays():
    assert CronExpr.parse("0 0 * * sun,sat").weekdays == {0, 6}


def test_parse_day_name_range():
    assert CronExpr.parse("0 9 * * Mon-Fri").weekdays == {1, 2, 3, 4, 5}


def test_parse_day_of_week_seven_is_sunday():
    assert CronExpr.parse("0 0 * * 7").weekdays == {0}


def test_parse_day_of_week_zero_to_seven_is_every_day_once():
    assert CronExpr.parse("0 0 * * 0-7").weekdays == frozenset(range(7))


def test_parse_keeps_the_original_text():
    assert CronExpr.parse("*/5  *  * * *").text == "*/5  *  * * *"


def test_parse_records_which_day_fields_were_star():
    c = CronExpr.parse("0 0 * * 1")
    assert (c.any_day, c.any_weekday) == (True, False)
    c = CronExpr.parse("0 0 1 * *")
    assert (c.any_day, c.any_weekday) == (False, True)


@pytest.mark.parametrize(
    ("alias", "expr"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
    ],
)
def test_parse_alias_means_its_five_field_expression(alias, expr):
    a, e = CronExpr.parse(alias), CronExpr.parse(expr)
    fields = ("minutes", "hours", "days", "months", "weekdays", "any_day", "any_weekday")
    assert [getattr(a, f) for f in fields] == [getattr(e, f) for f in fields]
    assert a.text == alias


def test_parse_alias_ignores_case_and_surrounding_space():
    assert CronExpr.parse("  @DAILY ").hours == {0}


# --- CronExpr.parse: errors -----------------------------------------------------------------


@pytest.mark.parametrize("text", ["* * * *", "* * * * * *", "", "@fortnightly"])
def test_parse_rejects_a_wrong_field_count(text):
    with pytest.raises(ValueError, match="5 fields"):
        CronExpr.parse(text)


@pytest.mark.parametrize(
    "text",
    [
        "60 * * * *",
        "* 24 * * *",
        "* * 0 * *",
        "* * 32 * *",
        "* * * 0 *",
        "* * * 13 *",
        "* * * * 8",
        "0-60 * * * *",
        "30-10 * * * *",
    ],
)
def test_parse_rejects_values_out_of_range(text):
    with pytest.raises(ValueError, match="outside"):
        CronExpr.parse(text)


@pytest.mark.parametrize("text", ["*/0 * * * *", "*/-1 * * * *", "1-5/0 * * * *"])
def test_parse_rejects_a_step_below_one(text):
    with pytest.raises(ValueError, match="bad step"):
        CronExpr.parse(text)


def test_parse_rejects_a_non_numeric_step():
    with pytest.raises(ValueError):
        CronExpr.parse("*/x * * * *")


@pytest.mark.parametrize("text", ["a * * * *", "* * * foo *", "* * * * funday", "1,,2 * * * *", "-5 * * * *"])
def test_parse_rejects_a_value_that_is_neither_number_nor_name(text):
    with pytest.raises(ValueError):
        CronExpr.parse(text)


def test_parse_rejects_day_names_in_the_month_field():
    with pytest.raises(ValueError):
        CronExpr.parse("0 0 1 mon *")


# --- CronExpr.next_after ----------------------------------------------------------------------


def test_next_after_every_15_minutes_goes_to_the_next_quarter():
    c = CronExpr.parse("*/15 * * * *")
    assert c.next_after(ts(2025, 6, 10, 10, 7)) == ts(2025, 6, 10, 10, 15)


def test_next_after_is_strictly_after_a_matching_instant():
    c = CronExpr.parse("*/15 * * * *")
    assert c.next_after(ts(2025, 6, 10, 10, 15)) == ts(2025, 6, 10, 10, 30)


def test_next_after_a_fraction_before_a_tick_is_that_tick():
    c = CronExpr.parse("*/15 * * * *")
    assert c.next_after(ts(2025, 6, 10, 10, 14, 59, 900_000)) == ts(2025, 6, 10, 10, 15)


def test_next_after_within_a_matching_minute_is_the_next_match():
    c = CronExpr.parse("* * * * *")
    assert c.next_after(ts(2025, 6, 10, 10, 0, 30)) == ts(2025, 6, 10, 10, 1)


def test_next_after_rolls_over_to_the_next_hour():
    c = CronExpr.parse("*/15 * * * *")
    assert c.next_after(ts(2025, 6, 10, 10, 50)) == ts(2025, 6, 10, 11, 0)


def test_next_after_returns_a_whole_minute():
    c = CronExpr.parse("* * * * *")
    assert c.next_after(ts(2025, 6, 10, 10, 0, 17, 123_456)) % 60 == 0


def test_next_after_weekday_schedule_is_later_the_same_weekday_morning():
    c = CronExpr.parse("0 9 * * 1-5")
    assert c.next_after(ts(2025, 6, 13, 8, 0)) == ts(2025, 6, 13, 9, 0)  # Friday


def test_next_after_weekday_schedule_skips_the_weekend_from_friday():
    c = CronExpr.parse("0 9 * * 1-5")
    assert c.next_after(ts(2025, 6, 13, 10, 0)) == ts(2025, 6, 16, 9, 0)  # Fri → Mon


def test_next_after_weekday_schedule_skips_the_weekend_from_saturday():
    c = CronExpr.parse("0 9 * * 1-5")
    assert c.next_after(ts(2025, 6, 14, 8, 0)) == ts(2025, 6, 16, 9, 0)  # Sat → Mon


def test_next_after_both_day_fields_restricted_fires_on_day_of_month_alone():
    c = CronExpr.parse("0 0 13 * 5")  # the 13th OR any Friday
    assert c.next_after(ts(2025, 5, 10)) == ts(2025, 5, 13)  # Tue 13 May, not a Friday


def test_next_after_both_day_fields_restricted_fires_on_day_of_week_alone():
    c = CronExpr.parse("0 0 13 * 5")
    assert c.next_after(ts(2025, 5, 13, 12)) == ts(2025, 5, 16)  # Fri 16 May, not the 13th


def test_next_after_only_day_of_month_restricted_ignores_weekdays():
    c = CronExpr.parse("0 0 13 * *")
    assert c.next_after(ts(2025, 5, 13, 12)) == ts(2025, 6, 13)


def test_next_after_only_day_of_week_restricted_ignores_days_of_month():
    c = CronExpr.parse("0 0 * * 5")
    assert c.next_after(ts(2025, 5, 10)) == ts(2025, 5, 16)


def test_next_after_feb_29_waits_for_the_next_leap_year():
    c = CronExpr.parse("0 0 29 2 *")
    assert c.next_after(ts(2025, 1, 1)) == ts(2028, 2, 29)


def test_next_after_day_31_skips_months_that_are_shorter():
    c = CronExpr.parse("0 0 31 * *")
    assert c.next_after(ts(2025, 4, 1)) == ts(2025, 5, 31)


def test_next_after_month_name_crosses_the_year():
    c = CronExpr.parse("0 12 1 mar *")
    assert c.next_after(ts(2025, 6, 1)) == ts(2026, 3, 1, 12, 0)


def test_next_after_yearly_is_next_new_year():
    assert CronExpr.parse("@yearly").next_after(ts(2025, 6, 15, 13, 30)) == ts(2026, 1, 1)


def test_next_after_finds_29_february_on_a_sunday_decades_ahead():
    # "*/7" is Sunday with the Vixie rule that both day fields must match; next in 2032:
    # a schedule this rare still fires, not "never fires".
    assert CronExpr.parse("0 0 29 2 */7").next_after(ts(2026, 1, 1)) == ts(2032, 2, 29)


def test_next_after_29_february_skips_2100_which_is_no_leap_year():
    assert CronExpr.parse("0 0 29 2 *").next_after(ts(2097, 1, 1)) == ts(2104, 2, 29)


def test_next_after_a_date_that_never_exists_raises():
    c = CronExpr.parse("0 0 30 2 *")
    with pytest.raises(ValueError, match="never fires"):
        c.next_after(ts(2025, 1, 1))


# --- Every ------------------------------------------------------------------------------------


def test_every_next_after_before_start_is_the_start():
    assert Every(60.0, 1000.0).next_after(500.0) == 1000.0


def test_every_next_after_at_start_is_one_interval_later():
    assert Every(60.0, 1000.0).next_after(1000.0) == 1060.0


def test_every_next_after_between_ticks_is_the_next_tick():
    assert Every(60.0, 1000.0).next_after(1130.5) == 1180.0


def test_every_next_after_exactly_on_a_later_tick_is_the_following_tick():
    assert Every(60.0, 1000.0).next_after(1120.0) == 1180.0


def test_every_next_after_a_tick_it_returned_is_strictly_later():
    e = Every(7.3, 1_700_000_000.0)
    first = e.next_after(1_700_000_000.0)
    second = e.next_after(first)
    assert second > first
    assert second == pytest.approx(1_700_000_000.0 + 2 * 7.3)


# --- parse_schedule / schedule_to_dict ----------------------------------------------------


def test_parse_schedule_cron_gives_a_cron_expression():
    s = parse_schedule({"cron": "*/5 * * * *"})
    assert isinstance(s, CronExpr)
    assert s.minutes == frozenset(range(0, 60, 5))


def test_parse_schedule_every_with_start_gives_an_every():
    assert parse_schedule({"every": 60, "start_at": 1000}) == Every(60.0, 1000.0)


def test_parse_schedule_every_without_start_starts_one_interval_from_now():
    before = time.time()
    s = parse_schedule({"every": 30})
    after = time.time()
    assert isinstance(s, Every)
    assert before + 30 <= s.start_at <= after + 30


def test_parse_schedule_needs_cron_or_every():
    with pytest.raises(ValueError, match="'cron' or 'every'"):
        parse_schedule({"start_at": 10})


def test_parse_schedule_rejects_a_cron_that_is_not_a_string():
    with pytest.raises(ValueError, match="string"):
        parse_schedule({"cron": 5})


def test_parse_schedule_rejects_an_invalid_cron_expression():
    with pytest.raises(ValueError):
        parse_schedule({"cron": "61 * * * *"})


@pytest.mark.parametrize("every", [0, -1, -0.5, True, "60", None, math.nan])
def test_parse_schedule_rejects_every_that_is_not_a_positive_number(every):
    with pytest.raises(ValueError, match="every"):
        parse_schedule({"every": every, "start_at": 0})


def test_parse_schedule_rejects_an_infinite_every():
    with pytest.raises(ValueError, match="every"):
        parse_schedule({"every": math.inf, "start_at": 1000.0})


@pytest.mark.parametrize("start", ["soon", math.nan, math.inf, [1]])
def test_parse_schedule_rejects_a_start_at_that_is_not_unix_seconds(start):
    with pytest.raises(ValueError, match="start_at"):
        parse_schedule({"every": 60, "start_at": start})


def test_parse_schedule_rejects_a_bool_start_at():
    with pytest.raises(ValueError, match="start_at"):
        parse_schedule({"every": 60, "start_at": True})


def test_schedule_to_dict_cron_round_trips():
    d = schedule_to_dict(parse_schedule({"cron": "0 9 * * 1-5"}))
    assert d == {"cron": "0 9 * * 1-5"}
    assert schedule_to_dict(parse_schedule(d)) == d


def test_schedule_to_dict_every_round_trips():
    d = schedule_to_dict(Every(90.0, 1234.5))
    assert d == {"every": 90.0, "start_at": 1234.5}
    assert parse_schedule(d) == Every(90.0, 1234.5)


def test_schedule_to_dict_alias_keeps_the_alias_text():
    assert schedule_to_dict(parse_schedule({"cron": "@hourly"})) == {"cron": "@hourly"}


# --- SchedulingTime ---------------------------------------------------------------------------


def test_scheduling_time_every_minute_starting_from_t_to_dict():
    t = 1_750_000_000.0
    assert SchedulingTime().every(minutes=1).starting_from(t).to_dict() == {"every": 60, "start_at": t}


def test_scheduling_time_every_adds_up_all_units():
    st = SchedulingTime().every(seconds=5, minutes=2, hours=1, days=1)
    assert st.interval == 5 + 120 + 3600 + 86400


def test_scheduling_time_defaults_to_ten_minutes_with_no_start():
    assert SchedulingTime().to_dict() == {"every": 600.0, "start_at": None}


def test_scheduling_time_from_now_starts_at_the_current_time():
    before = time.time()
    st = SchedulingTime().from_now()
    after = time.time()
    assert before <= st.start_at <= after


def test_scheduling_time_to_dict_is_accepted_by_parse_schedule():
    d = SchedulingTime().every(hours=2).starting_from(5000.0).to_dict()
    assert parse_schedule(d) == Every(7200.0, 5000.0)


@pytest.mark.parametrize("kwargs", [{}, {"seconds": 0}, {"minutes": -1}])
def test_scheduling_time_validate_rejects_an_interval_not_above_zero(kwargs):
    with pytest.raises(ValueError, match="above 0"):
        SchedulingTime().every(**kwargs).validate()


def test_scheduling_time_to_dict_validates():
    with pytest.raises(ValueError, match="above 0"):
        SchedulingTime().every(seconds=0).starting_from(1.0).to_dict()


def test_a_stepped_star_day_of_month_is_unrestricted_as_in_vixie_cron():
    # "*/2" in day-of-month with Monday in day-of-week: both must match (AND), not either.
    expr = CronExpr.parse("0 0 */2 * 1")
    t = datetime(2026, 1, 1, 12, 0).timestamp()
    nxt = datetime.fromtimestamp(expr.next_after(t))
    assert nxt.isoweekday() == 1 and nxt.day % 2 == 1
