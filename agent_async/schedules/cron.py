"""The cron model of schedules: which 5-field expressions are accepted, their fields, next fire times.

Independent of the queue engine: the engine translates the parsed fields into its own form
(agent_async.engine.cron for arq) and a test checks that every accepted expression translates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from croniter import croniter

__all__ = ["CronFields", "CronTranslationError", "cron_problem", "matches", "next_fire", "parse"]


class CronTranslationError(ValueError):
    """The expression is not a 5-field cron this layer can schedule (6 fields, L, W, #, H...)."""


@dataclass(frozen=True, slots=True)
class CronFields:
    """A parsed cron: each field the set of values it allows, or None for any.

    `weekday` uses cron's numbering (Sunday = 0). As in standard cron, when both `day` and
    `weekday` are restricted a time matches if EITHER matches.
    """

    minute: frozenset[int] | None
    hour: frozenset[int] | None
    day: frozenset[int] | None
    month: frozenset[int] | None
    weekday: frozenset[int] | None


def parse(expr: str) -> CronFields:
    """Expand steps, ranges, lists and names with croniter; refuse what cannot be scheduled."""
    fields = expr.split()
    if len(fields) != 5:
        raise CronTranslationError(f"{expr!r}: expected 5 fields (minute hour day month weekday), got {len(fields)}")
    try:
        parsed = croniter(expr)
    except (ValueError, KeyError) as exc:
        raise CronTranslationError(f"{expr!r}: {exc}") from None
    if parsed.nth_weekday_of_month:
        raise CronTranslationError(f"{expr!r}: 'weekday#n' cannot be scheduled")
    minute, hour, day, month, weekday = (_field_set(expr, values) for values in parsed.expanded)
    # croniter lets 7 stand for Sunday as well as 0.
    weekday = None if weekday is None else frozenset(d % 7 for d in weekday)
    return CronFields(minute, hour, day, month, weekday)


def _field_set(expr: str, values: Sequence[int | str]) -> frozenset[int] | None:
    if values == ["*"]:
        return None
    if not all(isinstance(v, int) for v in values):
        raise CronTranslationError(f"{expr!r}: 'L' and 'W' cannot be scheduled")
    return frozenset(int(v) for v in values)


def cron_problem(expr: str) -> str | None:
    """None if `expr` can be scheduled, else the reason it cannot."""
    try:
        parse(expr)
    except CronTranslationError as exc:
        return str(exc)
    return None


def next_fire(expr: str, after: datetime) -> datetime:
    """croniter's next fire time strictly after `after` (timezone-aware in, aware out)."""
    result: datetime = croniter(expr, after).get_next(datetime)
    return result


def matches(expr: str, at: datetime) -> bool:
    """Whether `expr` fires in the minute of `at` (read in `at`'s time zone)."""
    return bool(croniter.match(expr, at))
