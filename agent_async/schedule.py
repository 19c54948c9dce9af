"""Cron for periodic jobs: 5-field expressions translated into the field sets arq's cron understands."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from croniter import croniter

__all__ = ["CronSpec", "CronTranslationError", "cron_problem", "next_fire", "translate"]

_MINUTE, _HOUR, _DAY, _MONTH, _WEEKDAY = range(5)


class CronTranslationError(ValueError):
    """The expression is not a 5-field cron that arq's cron can express."""


@dataclass(frozen=True, slots=True)
class CronSpec:
    """One arq cron: each field a set of allowed values, or None for any. Fields are ANDed.

    `weekday` uses arq's numbering (Monday = 0), not cron's (Sunday = 0).
    """

    minute: frozenset[int] | None
    hour: frozenset[int] | None
    day: frozenset[int] | None
    month: frozenset[int] | None
    weekday: frozenset[int] | None


def translate(expr: str) -> tuple[CronSpec, ...]:
    """The arq crons whose fire times, together, are exactly `expr`'s under standard cron rules.

    arq ANDs all its fields. Standard cron (and croniter) ORs day-of-month and day-of-week when
    both are restricted: "0 0 13 * fri" fires on every 13th and on every Friday. That case becomes
    two crons, one per day field; a minute matching both fires once because a run's id is made of
    the schedule and the fire time. Steps, ranges, lists and names are expanded by croniter.
    Raises CronTranslationError for anything else (6 fields, L, W, #, H).
    """
    fields = expr.split()
    if len(fields) != 5:
        raise CronTranslationError(f"{expr!r}: expected 5 fields (minute hour day month weekday), got {len(fields)}")
    try:
        parsed = croniter(expr)
    except (ValueError, KeyError) as exc:
        raise CronTranslationError(f"{expr!r}: {exc}") from None
    if parsed.nth_weekday_of_month:
        raise CronTranslationError(f"{expr!r}: 'weekday#n' cannot be expressed as an arq cron")
    expanded = parsed.expanded
    sets = [_field_set(expr, values) for values in expanded]
    minute, hour, day, month, cron_weekday = sets
    weekday = None if cron_weekday is None else frozenset((d - 1) % 7 for d in cron_weekday)
    if day is not None and weekday is not None:
        return (
            CronSpec(minute, hour, day, month, None),
            CronSpec(minute, hour, None, month, weekday),
        )
    return (CronSpec(minute, hour, day, month, weekday),)


def _field_set(expr: str, values: Sequence[int | str]) -> frozenset[int] | None:
    if values == ["*"]:
        return None
    if not all(isinstance(v, int) for v in values):
        raise CronTranslationError(f"{expr!r}: 'L' and 'W' cannot be expressed as an arq cron")
    return frozenset(int(v) for v in values)


def next_fire(expr: str, after: datetime) -> datetime:
    """croniter's next fire time strictly after `after` (timezone-aware in, aware out)."""
    result: datetime = croniter(expr, after).get_next(datetime)
    return result


def cron_problem(expr: str) -> str | None:
    """None if `expr` can be scheduled, else the reason it cannot."""
    try:
        translate(expr)
    except CronTranslationError as exc:
        return str(exc)
    return None
