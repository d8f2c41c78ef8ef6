"""Derived pipelines: a table read as a stream, and the event-time work done on it.

A spec with ``source: {table: <pipeline>}`` reads that pipeline's table (Delta's streaming
source, or Spark's file source over a Parquet table's log) and declares, as data, any of:

- ``filter``: a SQL condition; rows for which it is not true are counted, not kept;
- ``deduplicate: {keys, within}``: one row per key within the watermark's delay;
- ``window`` (tumbling, sliding or session) with ``aggregate`` and ``group_by``;
- ``state: {kind: session | custom, keys, timeout}``: per-key logic over Spark's state store;
- ``watermark`` and ``output_mode``.

Everything here is pure Python: what is accepted, the early checks that name the field,
what the output table holds, when a row counts as late, and which changes the state in an
existing checkpoint cannot survive.

**Late rows.** Spark drops a row that is behind the watermark without a trace. Sluice
applies Spark's own rule to the same rows and quarantines each dropped one with its reason:
in batch N the rule uses the watermark of batch N-1 (the one Spark uses for late rows since
SPARK-40925), and a row is late when the end of the latest window it would count in is at
or before it (:func:`late_end_sql`). For deduplication and state (and windows after
deduplication, which runs first) that end is the event time.
"""

from __future__ import annotations

from typing import Annotated, Literal

import sqlglot
from pydantic import Field, model_validator
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from sluice.spec import sqlcheck
from sluice.spec.eventtime import per_batch
from sluice.spec.formats import FORMATS, table_format
from sluice.spec.model import Duration, StrictModel, duration_ms

Name = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]

WINDOW_START, WINDOW_END = "window_start", "window_end"
#: Beside a derived checkpoint's offsets/ and commits/: what its state was built from.
STATE_FILE = "sluice_state.json"
SESSION_START, SESSION_END, SESSION_EVENTS = "session_start", "session_end", "events"


class TableSource(StrictModel):
    """Another pipeline's table, read as a stream from its start."""

    table: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")]
    """The upstream pipeline's name; its table is read as a stream."""
    max_files_per_trigger: Annotated[int, Field(gt=0)] | None = None
    """Cap on files per micro-batch (Delta's maxFilesPerTrigger, the file source's too)."""
    on_upstream_change: Literal["fail", "skip"] = "fail"
    """What a commit upstream that deletes or rewrites rows (DELETE, UPDATE, MERGE; an upstream in ``output_mode:
    update`` MERGEs every batch) means here. ``fail``: the stream stops and says so; ``sluice rebuild`` recomputes
    this table from the upstream as it is now. ``skip``: such commits are ignored whole (Delta's
    skipChangeCommits): rows they delete stay counted here, and rows they add or rewrite are not read."""


class Deduplicate(StrictModel):
    """Keep the first row of each key; a repeat within ``within`` of it is dropped, one
    later than that is kept (Spark's dropDuplicatesWithinWatermark)."""

    keys: list[Name] = Field(min_length=1)
    """The columns whose values identify a repeat."""
    within: Duration | None = None
    """The watermark's delay: set one of the two, or both the same."""


class Window(StrictModel):
    """Event-time windows over ``time`` (default: the upstream table's event time)."""

    type: Literal["tumbling", "sliding", "session"] = "tumbling"
    """``tumbling`` (fixed, back to back), ``sliding`` (fixed, overlapping) or ``session`` (ended by a gap)."""
    size: Duration | None = None
    """Tumbling and sliding windows: how long each window is."""
    slide: Duration | None = None
    """Sliding windows: how far apart windows start."""
    gap: Duration | None = None
    """Session windows: how long without an event ends a session."""
    time: Name | None = None
    """The timestamp column the windows are over [default: the upstream table's event time]."""

    @model_validator(mode="after")
    def _shape(self) -> Window:
        if self.type == "session":
            if not self.gap:
                raise ValueError("a session window needs 'gap' (e.g. gap: 30 minutes)")
            if self.size or self.slide:
                raise ValueError("a session window has a 'gap', not 'size' or 'slide'")
            return self
        if not self.size:
            raise ValueError(f"a {self.type} window needs 'size' (e.g. size: 10 minutes)")
        if self.gap:
            raise ValueError(f"'gap' is for session windows, not {self.type} ones")
        if self.type == "tumbling" and self.slide:
            raise ValueError("a tumbling window has no 'slide'; use type: sliding")
        if self.type == "sliding":
            if not self.slide:
                raise ValueError("a sliding window needs 'slide' (e.g. slide: 5 minutes)")
            size, slide = duration_ms(self.size), duration_ms(self.slide)
            if slide > size:
                raise ValueError(f"slide ({self.slide}) must not be longer than size ({self.size})")
        return self


class State(StrictModel):
    """Per-key logic over Spark's state store (transformWithStateInPandas, RocksDB).

    ``session``: one row per session of each key; a session ends when ``timeout`` passes in
    event time without an event of that key. ``custom``: ``processor`` names a
    StatefulProcessor class (``package.module:Class``, built without arguments, importable
    where Spark runs Python) whose rows have the ``output`` schema; it gets the keys, the
    event time as ``event_time`` and the upstream's own columns, in event-time mode (register
    timers; late rows never reach it); its ``timeout_ms`` attribute holds ``timeout``.
    """

    kind: Literal["session", "custom"]
    """``session``: one row per session of each key; ``custom``: your StatefulProcessor."""
    keys: list[Name] = Field(min_length=1)
    """The columns state is kept per."""
    timeout: Duration | None = None
    """``session``: how long in event time without an event of a key ends its session."""
    time: Name | None = None
    """The event-time column [default: the upstream table's event time]."""
    processor: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    """custom: the StatefulProcessor class, ``package.module:Class``."""
    output: str | None = None
    """custom: the output rows' schema as Spark DDL, e.g. ``user string, total double``."""

    @model_validator(mode="after")
    def _kind(self) -> State:
        if self.kind == "custom" and not (self.processor and self.output):
            raise ValueError("a custom state needs 'processor' (package.module:Class) and 'output' (Spark DDL)")
        if self.kind == "session" and (self.processor or self.output):
            raise ValueError("'processor' and 'output' are for kind: custom")
        return self


class DerivedError(ValueError):
    """A derived spec that cannot run, with the field to fix."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


def check_aggregate(field: str, sql: str, columns: list[str]) -> None:
    """An aggregate must parse, use known columns, aggregate, and be deterministic."""
    if wrong := sqlcheck.problem(sql, columns):
        raise DerivedError(field, wrong)
    try:
        tree = sqlglot.parse_one(sql, dialect="spark")
        names, distinct = sqlcheck.function_names(sql)
    except (ParseError, TokenError) as exc:  # pragma: no cover - sqlcheck found it first
        raise DerivedError(field, f"not valid Spark SQL: {exc}") from None
    bad = sorted(n for n in names if n in sqlcheck.NON_DETERMINISTIC)
    if bad:
        raise DerivedError(
            field,
            f"{', '.join(bad)} is not deterministic: a batch replayed after a crash must compute the same "
            "result as the first time (use min/max instead of first/last, sort_array(collect_set(...)) "
            "instead of collect_list)",
        )
    if distinct:
        raise DerivedError(field, "DISTINCT aggregates are not supported on streams; use approx_count_distinct(column)")
    if not any(isinstance(n, exp.AggFunc) for n in tree.find_all(exp.AggFunc)) and not _looks_aggregate(names):
        raise DerivedError(field, f"{sql!r} aggregates nothing; use an aggregate such as count(*), sum(x), max(x)")


_AGGREGATES = {
    "count",
    "count_if",
    "sum",
    "avg",
    "mean",
    "min",
    "max",
    "min_by",
    "max_by",
    "approx_count_distinct",
    "collect_set",
    "stddev",
    "stddev_samp",
    "stddev_pop",
    "variance",
    "var_samp",
    "var_pop",
    "bool_and",
    "bool_or",
    "every",
    "some",
    "percentile_approx",
    "approx_percentile",
    "median",
    "bit_and",
    "bit_or",
    "bit_xor",
    "histogram_numeric",
    "kurtosis",
    "skewness",
    "corr",
    "covar_pop",
    "covar_samp",
}


def _looks_aggregate(names: set[str]) -> bool:
    return bool(names & _AGGREGATES)


def late_end_sql(time_col: str, window: Window | None) -> str:
    """The end of the latest window a row with event time ``time_col`` counts in; Spark
    drops the row when that end is at or before the late-row watermark.

    A tumbling or sliding window's latest window containing t starts at t floored to the
    slide; a session window's is t + gap; deduplication and state compare t itself.
    """
    t = f"`{time_col}`"
    if window is None:
        return t
    if window.type == "session":
        return f"{t} + INTERVAL {duration_ms(window.gap or '0 ms')} MILLISECONDS"
    slide = duration_ms(window.slide or window.size or "0 ms")
    size = duration_ms(window.size or "0 ms")
    return f"timestamp_millis(floor(unix_millis({t}) / {slide}) * {slide} + {size})"


def late_reason_sql(time_col: str, window: Window | None, watermark_ms: int) -> str:
    """The quarantine reason of a late row, as SQL."""
    wm = _iso_sql(per_batch(f"timestamp_millis({watermark_ms})"))  # the same code each batch
    t = _iso_sql(f"`{time_col}`")
    if window is None:
        return f"concat('late: event time ', {t}, ' is behind the watermark ', {wm})"
    end = _iso_sql(late_end_sql(time_col, window))
    return (
        f"concat('late: event time ', {t}, ' is behind the watermark ', {wm}, "
        f"' (its {window.type} window, ending ', {end}, ', had closed)')"
    )


def _iso_sql(ts: str) -> str:
    return f"date_format({ts}, \"yyyy-MM-dd'T'HH:mm:ss.SSS'Z'\")"


# --- what a derived spec declares, checked against the columns it reads -----------------------


class Derivation:
    """The derived sections of one spec, with the columns of the table it reads.

    Built by the loader, which turns :class:`DerivedError` into a SpecError naming the file."""

    def __init__(
        self,
        *,
        filter: str | None,
        deduplicate: Deduplicate | None,
        window: Window | None,
        aggregate: dict[str, str],
        group_by: list[str],
        watermark: str | None,
        output_mode: str,
        state: State | None,
        sink_format: str,
        inputs: dict[str, str | None],
        default_time: str,
    ) -> None:
        self.filter, self.deduplicate, self.window, self.state = filter, deduplicate, window, state
        self.aggregate, self.group_by, self.output_mode = dict(aggregate), list(group_by), output_mode
        self.sink_format, self.inputs, self.default_time = sink_format, dict(inputs), default_time
        within = deduplicate.within if deduplicate else None
        self.watermark = watermark or within

    @property
    def time(self) -> str:
        """The event-time column the watermark is on."""
        if self.window and self.window.time:
            return self.window.time
        if self.state and self.state.time:
            return self.state.time
        return self.default_time

    @property
    def stateful(self) -> bool:
        return bool(self.deduplicate or self.window or self.state)

    def check(self) -> None:
        """Every early refusal, naming the field (raises DerivedError)."""
        names = list(self.inputs)
        known = ", ".join(names)

        def column(field: str, name: str) -> None:
            if name not in self.inputs:
                raise DerivedError(field, f"no column {name!r} in the upstream table (columns: {known})")

        if self.filter and (wrong := sqlcheck.problem(self.filter, names)):
            raise DerivedError("filter", wrong)
        time_field = "state.time" if self.state and self.state.time else "window.time"
        column(time_field, self.time)
        if self.inputs.get(self.time) not in (None, "timestamp"):
            raise DerivedError(time_field, f"{self.time!r} is a {self.inputs[self.time]}, not a timestamp")
        d = self.deduplicate
        if d is not None:
            for i, key in enumerate(d.keys):
                column(f"deduplicate.keys[{i}]", key)
        if self.window is None and (self.aggregate or self.group_by):
            field = "aggregate" if self.aggregate else "group_by"
            raise DerivedError(field, "aggregates are computed per event-time window: declare 'window' too")
        if self.window is not None:
            if not self.aggregate:
                raise DerivedError("aggregate", "a window needs at least one aggregate, e.g. events: count(*)")
            for i, name in enumerate(self.group_by):
                column(f"group_by[{i}]", name)
            for name, sql in self.aggregate.items():
                check_aggregate(f"aggregate.{name}", sql, names)
            taken = {WINDOW_START, WINDOW_END, *self.group_by}
            for name in self.aggregate:
                if name in taken:
                    raise DerivedError(f"aggregate.{name}", f"{name!r} is already an output column")
        if self.state is not None:
            if self.window is not None:
                raise DerivedError("state", "give either 'window' (with aggregates) or 'state', not both")
            for i, key in enumerate(self.state.keys):
                column(f"state.keys[{i}]", key)
            if not self.state.timeout:
                raise DerivedError(
                    "state.timeout",
                    "state without a timeout is kept for every key forever; give the event time after which "
                    "a key's state ends (e.g. timeout: 30 minutes)",
                )
        if self.stateful and not self.watermark:
            field = "window" if self.window else "state" if self.state else "deduplicate.within"
            raise DerivedError(
                field,
                f"{'a window' if self.window else 'state' if self.state else 'deduplication'} needs a watermark "
                "(e.g. watermark: 10 minutes): without one Spark keeps state for every key forever"
                + (" and append mode never writes a window" if self.window else ""),
            )
        if d is not None and d.within and self.watermark and duration_ms(d.within) != duration_ms(self.watermark):
            raise DerivedError(
                "deduplicate.within",
                f"Spark deduplicates within the watermark's delay: within ({d.within}) must equal watermark "
                f"({self.watermark}), or leave one of them out",
            )
        gap_field, gap = None, None
        if self.window is not None and self.window.type == "session":
            gap_field, gap = "window.gap", self.window.gap
        if self.state is not None and self.state.kind == "session":
            gap_field, gap = "state.timeout", self.state.timeout
        if gap and self.watermark and duration_ms(gap) > duration_ms(self.watermark):
            raise DerivedError(
                gap_field or "window.gap",
                f"the session gap ({gap}) is larger than the watermark ({self.watermark}): events a gap apart "
                "still belong to one session, but the watermark declares them late sooner, so sessions would be "
                "cut by rows Spark drops; make the watermark at least the gap",
            )
        if self.output_mode == "update":
            fmt = table_format(self.sink_format)
            if fmt is None or not fmt.merges:
                merging = " or ".join(f.name for f in FORMATS.values() if f.merges)
                raise DerivedError(
                    "output_mode",
                    f"update rewrites a window's row as it changes; a {self.sink_format} sink can only append "
                    f"(use sink.format: {merging}, or output_mode: append)",
                )
            if self.window is None:
                raise DerivedError("output_mode", "update is for windowed aggregates; deduplication and state append")
        if not self.stateful and self.output_mode != "append":
            raise DerivedError("output_mode", "only stateful pipelines have an output mode")

    @property
    def late_window(self) -> Window | None:
        """The window whose end decides lateness; None when the event time itself does.

        Deduplication runs first and drops every row at or behind the watermark, so with it
        the event time decides even when windows follow."""
        return None if self.deduplicate is not None else self.window

    def output_columns(self, date_column: str) -> dict[str, str | None]:
        """The output table's columns (a type is None where Spark decides it)."""
        if self.window is not None:
            cols: dict[str, str | None] = {WINDOW_START: "timestamp", WINDOW_END: "timestamp"}
            cols |= {g: self.inputs.get(g) for g in self.group_by}
            cols |= {name: None for name in self.aggregate}
        elif self.state is not None and self.state.kind == "session":
            cols = {k: self.inputs.get(k) for k in self.state.keys}
            cols |= {SESSION_START: "timestamp", SESSION_END: "timestamp", SESSION_EVENTS: "bigint"}
        elif self.state is not None:
            cols = {name: None for name in ddl_names(self.state.output or "")}
        else:
            cols = {k: v for k, v in self.inputs.items() if k != date_column}
        return cols | {date_column: "date"}

    def date_source(self) -> str | None:
        """The column whose date partitions the output; None for a custom state's rows,
        which are partitioned by the day they were written."""
        if self.window is not None:
            return WINDOW_START
        if self.state is not None:
            return SESSION_START if self.state.kind == "session" else None
        return self.time

    def signature(self) -> dict[str, object]:
        """What the state in a checkpoint was built from: a change here cannot reuse it."""
        return {
            "source_time": self.time,
            "deduplicate": sorted(self.deduplicate.keys) if self.deduplicate else None,
            "window": self.window.model_dump(mode="json", exclude={"time"}) if self.window else None,
            "group_by": self.group_by,
            "aggregate": self.aggregate,
            "state": self.state.model_dump(mode="json", exclude={"time"}) if self.state else None,
            "output_mode": self.output_mode,
        }


def ddl_names(ddl: str) -> list[str]:
    """Column names of a simple Spark DDL list (``a string, b struct<x: int>``)."""
    names, depth, current = [], 0, ""
    for ch in ddl + ",":
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        if ch == "," and depth == 0:
            if current.strip():
                names.append(current.strip().split()[0].strip("`"))
            current = ""
        else:
            current += ch
    return names


def signature_changes(before: dict[str, object], now: dict[str, object]) -> list[str]:
    return sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))


def incompatible_message(name: str, changed: list[str], checkpoint: str, table: str) -> str:
    return (
        f"{name}: the checkpoint {checkpoint} holds state built for a different {', '.join(changed)}. "
        "Spark cannot carry state over such a change (keys, windows and aggregates are the state's shape), "
        "and a result mixing the two would be wrong. Either:\n"
        f"  - give the pipeline a new checkpoint and a new sink.path (it reads its source table from the start), or\n"
        f"  - restore the previous spec, or\n"
        f"  - keep the spec, remove the old checkpoint and table {table} yourself, and let it rebuild from the source table."
    )
