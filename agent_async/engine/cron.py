"""Schedules as arq crons: the cron model's fields translated into arq's field sets."""

from __future__ import annotations

from dataclasses import dataclass

from agent_async.schedules.cron import CronTranslationError, parse

__all__ = ["CronSpec", "CronTranslationError", "translate"]


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
    the schedule and the fire time. Raises CronTranslationError for what the model refuses.
    """
    fields = parse(expr)
    weekday = None if fields.weekday is None else frozenset((d - 1) % 7 for d in fields.weekday)
    if fields.day is not None and weekday is not None:
        return (
            CronSpec(fields.minute, fields.hour, fields.day, fields.month, None),
            CronSpec(fields.minute, fields.hour, None, fields.month, weekday),
        )
    return (CronSpec(fields.minute, fields.hour, fields.day, fields.month, weekday),)
