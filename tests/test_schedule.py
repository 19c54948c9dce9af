"""Cron translation: arq's ANDed field sets reproduce croniter's fire times exactly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from arq.cron import next_cron
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_async.engine.cron import CronTranslationError, translate
from agent_async.schedules.cron import next_fire

MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]


def field(low: int, high: int, names: list[str] | None = None) -> st.SearchStrategy[str]:
    """One cron field: *, */n, a, a-b, a-b/n, lists of those, and names where the field has them."""
    number = st.integers(low, high)
    atom = st.one_of(
        number.map(str),
        st.tuples(number, number).map(lambda ab: f"{min(ab)}-{max(ab)}"),
        st.tuples(number, number, st.integers(1, 7)).map(lambda abn: f"{min(abn[:2])}-{max(abn[:2])}/{abn[2]}"),
    )
    if names:
        atom = st.one_of(atom, st.sampled_from(names))
    return st.one_of(
        st.just("*"),
        st.integers(1, max(2, (high - low) // 2)).map(lambda n: f"*/{n}"),
        st.lists(atom, min_size=1, max_size=3).map(",".join),
    )


expressions = st.tuples(
    field(0, 59), field(0, 23), field(1, 31), field(1, 12, MONTHS), field(0, 7, DAYS)
).map(" ".join)


def arq_fire_times(expr: str, start: datetime, count: int) -> list[datetime]:
    """The next `count` fire times of the arq crons `translate` produces (union, deduplicated)."""
    specs = translate(expr)
    cursors = {spec: start for spec in specs}
    fired: list[datetime] = []
    while len(fired) < count:
        nexts = {
            spec: next_cron(
                cursor, month=spec.month and set(spec.month), day=spec.day and set(spec.day),
                weekday=spec.weekday and set(spec.weekday), hour=spec.hour and set(spec.hour),
                minute=spec.minute and set(spec.minute), second=0, microsecond=0,
            )
            for spec, cursor in cursors.items()
        }
        soonest = min(nexts.values())
        fired.append(soonest)
        for spec, when in nexts.items():
            if when == soonest:
                cursors[spec] = when
    return fired


def croniter_fire_times(expr: str, start: datetime, count: int) -> list[datetime]:
    fired, cursor = [], start
    for _ in range(count):
        cursor = next_fire(expr, cursor)
        fired.append(cursor)
    return fired


@settings(max_examples=300, deadline=None)
@given(expr=expressions, offset_min=st.integers(0, 60 * 24 * 366 * 3))
def test_translation_fires_exactly_when_croniter_does(expr: str, offset_min: int) -> None:
    """Property: for generated expressions (steps, ranges, lists, names, day-of-month and
    day-of-week both restricted), the next 12 fire times equal croniter's."""
    start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=offset_min)
    assert arq_fire_times(expr, start, 12) == croniter_fire_times(expr, start, 12)


def test_day_of_month_and_weekday_are_ored() -> None:
    """'0 0 13 * fri' fires on every 13th and on every Friday (arq alone would AND them)."""
    start = datetime(2026, 11, 1, tzinfo=UTC)
    fired = arq_fire_times("0 0 13 * fri", start, 4)
    assert [d.day for d in fired] == [6, 13, 20, 27]
    assert len(translate("0 0 13 * fri")) == 2
    assert len(translate("0 0 13 * *")) == 1


@pytest.mark.parametrize("expr", ["0 0 L * *", "0 0 * * 1#2", "0 0 * * * *", "61 * * * *", "nonsense"])
def test_untranslatable_expressions_are_refused(expr: str) -> None:
    with pytest.raises(CronTranslationError):
        translate(expr)
