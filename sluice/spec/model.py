"""Base types shared by the spec's sections: a strict, frozen model and durations."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(milliseconds?|ms|seconds?|s|minutes?|min|hours?|h|days?|d)")


def duration_seconds(text: str) -> float:
    """'10 seconds', '500 ms', '5 minutes', '1h', '2 days' as seconds."""
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not a duration such as '30 seconds', '500 milliseconds' or '5 minutes'")
    unit = m.group(2)
    if unit.startswith("mil") or unit == "ms":
        factor = 0.001
    elif unit.startswith("s"):
        factor = 1.0
    elif unit.startswith("m"):
        factor = 60.0
    elif unit.startswith("h"):
        factor = 3600.0
    else:
        factor = 86400.0
    return float(m.group(1)) * factor


def _duration(v: str) -> str:
    duration_seconds(v)
    return v


#: A string such as '10 seconds', checked when the spec loads.
Duration = Annotated[str, AfterValidator(_duration)]


#: Airflow's presets; anything else must look like a cron expression of 5 (or 6) fields.
SCHEDULE_PRESETS = ("@once", "@continuous", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly")
_CRON_FIELD = re.compile(r"[0-9A-Za-z*/,?#-]+")


def check_schedule(v: str) -> str:
    # Checked here, so a typo makes one spec invalid instead of failing the whole DAG file.
    fields = v.split()
    if v in SCHEDULE_PRESETS or (len(fields) in (5, 6) and all(_CRON_FIELD.fullmatch(f) for f in fields)):
        return v
    raise ValueError(f"{v!r} is not a cron expression such as '*/5 * * * *' or one of {', '.join(SCHEDULE_PRESETS)}")


#: An Airflow schedule: a cron expression or a preset.
Schedule = Annotated[str, AfterValidator(check_schedule)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
