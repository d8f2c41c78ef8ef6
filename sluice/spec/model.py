"""Base types shared by the spec's sections: a strict, frozen model, durations and schedules."""

from __future__ import annotations

import re
from typing import Annotated

from croniter import croniter
from pydantic import AfterValidator, BaseModel, ConfigDict

#: The one duration grammar: a number and a unit. Spark and the trigger forms only ever see
#: the normalised form (:func:`normalize_duration`): a whole number of the largest exact unit.
DURATION_UNITS = r"milliseconds?|ms|seconds?|secs?|s|minutes?|mins?|hours?|hrs?|h|days?|d"
_DURATION = re.compile(rf"(\d+(?:\.\d+)?)\s*({DURATION_UNITS})", re.IGNORECASE)
_UNITS_MS = (("day", 86_400_000), ("hour", 3_600_000), ("minute", 60_000), ("second", 1000), ("millisecond", 1))
DURATION_HELP = "a number and a unit: '500 milliseconds', '30 seconds', '1.5 minutes', '2 hours', '1 day'"


def _unit_ms(unit: str) -> int:
    unit = unit.lower()
    if unit == "ms" or unit.startswith("mil"):
        return 1
    if unit.startswith("s"):
        return 1000
    if unit.startswith("m"):
        return 60_000
    if unit.startswith("h"):
        return 3_600_000
    return 86_400_000


def duration_ms(text: str) -> int:
    """A duration in whole milliseconds; ValueError for anything but the grammar."""
    m = _DURATION.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"{text!r} is not a duration: {DURATION_HELP}")
    ms = float(m.group(1)) * _unit_ms(m.group(2))
    if ms != int(ms):
        raise ValueError(f"{text!r} is not a whole number of milliseconds")
    return int(ms)


def duration_seconds(text: str) -> float:
    """'10 seconds', '500 ms', '5 minutes', '1h', '2 days' as seconds."""
    return duration_ms(text) / 1000


def normalize_duration(text: str) -> str:
    """The form Spark and the forms read: '1h' -> '1 hour', '1.5 minutes' -> '90 seconds'."""
    ms = duration_ms(text)
    for unit, size in _UNITS_MS:
        if ms % size == 0 and (ms or size == 1000):
            n = ms // size
            return f"{n} {unit}{'' if n == 1 else 's'}"
    raise AssertionError("unreachable: every duration is a whole number of milliseconds")


#: A string such as '10 seconds', checked and normalised when the spec loads.
Duration = Annotated[str, AfterValidator(normalize_duration)]


#: Airflow's presets; anything else must be a cron expression croniter accepts.
SCHEDULE_PRESETS = ("@once", "@continuous", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly")


def check_schedule(v: str) -> str:
    # Checked here, so a typo makes one spec invalid instead of failing the whole DAG file.
    if v in SCHEDULE_PRESETS or (len(v.split()) in (5, 6) and croniter.is_valid(v)):
        return v
    raise ValueError(f"{v!r} is not a cron expression such as '*/5 * * * *' or one of {', '.join(SCHEDULE_PRESETS)}")


#: An Airflow schedule: a cron expression or a preset.
Schedule = Annotated[str, AfterValidator(check_schedule)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
