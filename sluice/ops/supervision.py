"""Supervision: a stream's status, its verdict, and the one idempotent pass that acts on it.

:func:`status` reads the run records, the lease (the driver's liveness), the checkpoint's
commit log and the broker's end offsets (Spark never commits offsets to Kafka), or a derived
pipeline's upstream table; :func:`sluice.ops.health.assess` decides; :func:`supervise` starts
or restarts the stream through :mod:`sluice.ops.stream`, or fails loudly with the reason.
``sluice status`` shows the same :class:`StreamStatus`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import KafkaException

from sluice import faults
from sluice.errors import AlreadyRunning, IntentChanged, StreamUnhealthy
from sluice.ops.drivers import running
from sluice.ops.health import Observation, Verdict, assess
from sluice.ops.stream import Started, start
from sluice.ops.target import SparkTarget
from sluice.records import audit as audits
from sluice.records.checkpoint import Committed, read_committed
from sluice.records.run import Driver, Failures, Status, SupervisionPass
from sluice.records.tables import upstream_lag
from sluice.spec import Pipeline, duration_seconds
from sluice.state.lease import Holder
from sluice.topics import end_offsets, kafka_reason, list_topics

#: Offsets of the pipeline's topics, by topic and partition (the broker's, or a test's).
EndOffsets = Callable[[Pipeline], dict[str, dict[int, int]]]


def broker_end_offsets(pipeline: Pipeline, timeout: float = 3.0) -> dict[str, dict[int, int]]:
    """End offsets of the pipeline's topics (a topic pattern is matched against the broker's
    topics); a broker that does not answer within ``timeout`` raises KafkaException. A derived
    pipeline reads a table, not Kafka: it has none."""
    if pipeline.upstream is not None:
        return {}
    src = pipeline.kafka
    topics = list(src.topics or [])
    if not topics and src.topic_pattern:
        topics = [t for t in list_topics(src.bootstrap_servers, timeout) if re.fullmatch(src.topic_pattern, t)]
    return {t: end_offsets(src.bootstrap_servers, t, timeout) for t in topics}


@dataclass(frozen=True)
class StreamStatus:
    """What ``sluice status`` shows and supervision decides from."""

    pipeline: str
    observation: Observation
    committed: Committed
    verdict: Verdict
    driver: Driver | None
    status: Status | None
    broker_error: str | None = None  # the broker did not answer: lag unknown
    rescued: audits.Rescued | None = None  # recent batches kept undeclared fields in _rescued
    holder: Holder | None = None  # the driver's lease: on which host, which epoch
    supervision: str = ""  # who supervises the stream, or why nothing does

    @property
    def healthy(self) -> bool:
        return self.verdict.healthy

    def as_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "healthy": self.healthy,
            "verdict": asdict(self.verdict),
            "observation": asdict(self.observation),
            "last_committed_batch": self.committed.batch_id,
            "driver": asdict(self.driver) if self.driver else None,
            "status": asdict(self.status) if self.status else None,
            "broker_error": self.broker_error,
            "rescued": asdict(self.rescued) if self.rescued else None,
            "lease": asdict(self.holder) if self.holder else None,
            "supervision": self.supervision,
        }


# Final states a driver reports on its way out, just before it releases its lease.
FINAL = ("finished", "stopped", "failed")


def status(
    pipeline: Pipeline, offsets: EndOffsets = broker_end_offsets, now: float | None = None, *, start_new: bool = True
) -> StreamStatus:
    """Observe the stream (without changing anything) and judge it (``start_new``: see :func:`assess`)."""
    now = time.time() if now is None else now
    driver, st = Driver.read(pipeline.name), Status.read(pipeline.name)
    held = running(pipeline)
    if held is not None and st is not None and st.state in FINAL and st.updated_at >= held.acquired_at:
        held = None  # the driver said it ended and is letting go of its lease: it is not running
    committed = read_committed(pipeline.checkpoint_path)
    lag, broker_error, lag_unit, lag_source = None, None, "records", "Kafka"
    up = pipeline.upstream
    if up is not None:  # it reads a table: its lag is what that table has that it has not read
        assert up.table_format is not None  # the loader refuses a derived pipeline over a topic
        lag = upstream_lag(pipeline.checkpoint_path, up.table_format.name, up.sink_path)
        lag_unit, lag_source = up.table_format.lag_unit, f"the table of {up.name}"
    else:
        try:
            lag = committed.lag(offsets(pipeline))
        except KafkaException as exc:
            broker_error = f"Kafka at {pipeline.kafka.bootstrap_servers} did not answer: {kafka_reason(exc)}"
    failures = Failures.read(pipeline.name)
    obs = Observation(
        desired=driver.desired if driver else ("running" if held is not None else None),
        alive=held is not None,
        state=st.state if st else None,
        error=st.error if st else None,
        lag=lag,
        lag_unit=lag_unit,
        lag_source=lag_source,
        since_commit=None if committed.committed_at is None else now - committed.committed_at,
        since_start=None if held is None else max(0.0, now - held.acquired_at),
        since_heartbeat=None if st is None or held is None else now - st.updated_at,
        failures=failures.count if failures else 0,
        failed_batch=failures.batch if failures else None,
        since_failure=None if failures is None else now - failures.last_at,
    )
    s = pipeline.spec.supervision
    verdict = assess(
        obs,
        max_stall=duration_seconds(s.max_stall),
        max_lag=s.max_lag if up is None else None,  # records in Kafka; a table's lag is versions or files
        max_failures=s.max_failures,
        backoff=duration_seconds(s.backoff),
        name=pipeline.name,
        start_new=start_new,
    )
    rescued = audits.rescued(pipeline) if pipeline.table_format else None
    supervision = supervised_by(pipeline, SupervisionPass.read(pipeline.name), now)
    return StreamStatus(pipeline.name, obs, committed, verdict, driver, st, broker_error, rescued, held, supervision)


def supervised_by(pipeline: Pipeline, last: SupervisionPass | None, now: float) -> str:
    """Who supervises the stream, or why nothing does: the last supervision pass against the
    DAG's schedule (a pass missing for two of its runs means nothing runs it now)."""
    dag, schedule = f"sluice_{pipeline.name}", pipeline.spec.supervision.schedule
    ago = "" if last is None else f"{_ago(now - last.at)} ago on {last.host} ({last.by})"
    if schedule is None or schedule in ("@once", "@continuous"):
        why = f"supervision.schedule is {schedule or 'null'}"
        return f"on demand only ({why}); last pass {ago}" if last else f"not supervised: {why}"
    if last is None:
        return f"not supervised: no supervision pass recorded (is DAG {dag} paused, or not deployed?)"
    from croniter import croniter

    runs = croniter(_cron(schedule), now)
    runs.get_prev(float)
    missed_since = runs.get_prev(float)  # the run before the latest: a pass since then is on time
    if last.at < missed_since - 60:
        return f"not supervised: the last supervision pass was {ago}; DAG {dag} runs {schedule}: is it paused?"
    return f"supervised: last pass {ago}; DAG {dag} runs {schedule}"


#: Airflow's presets as cron expressions (sluice.spec.model.SCHEDULE_PRESETS).
_PRESETS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@quarterly": "0 0 1 */3 *",
    "@yearly": "0 0 1 1 *",
}


def _cron(schedule: str) -> str:
    return _PRESETS.get(schedule, schedule)


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


@dataclass(frozen=True)
class Supervised:
    status: StreamStatus
    started: Started | None = None  # set when this pass started or restarted the stream
    note: str | None = None  # why a start it decided on did not happen


def supervise(
    pipeline: Pipeline,
    target: SparkTarget,
    *,
    by: str,
    available_now: bool = False,
    processing_time: str | None = None,
    offsets: EndOffsets = broker_end_offsets,
    start_new: bool = True,
) -> Supervised:
    """One idempotent supervision pass: start or restart if needed, raise if unhealthy or failed.
    Without ``start_new`` a stream nobody started yet is left alone (see :func:`assess`).

    A driver that stopped reporting is restarted only once its lease has expired: no host can
    know sooner that it is dead (it may be paused, or cut off), and the launch takes the lease.
    The launch is recorded against the driver record this pass read, so a stop a person
    recorded meanwhile stands (the pass then starts nothing)."""
    SupervisionPass(pipeline.name, by, time.time()).save()
    st = status(pipeline, offsets, start_new=start_new)
    if st.verdict.action in ("unhealthy", "failed"):
        raise StreamUnhealthy(f"{pipeline.name}: {st.verdict.reason}")
    if st.verdict.action in ("start", "restart"):
        faults.point("supervise.decided")
        try:
            started = start(
                pipeline,
                target,
                by=by,
                available_now=available_now,
                processing_time=processing_time,
                fresh=False,
                as_of=st.driver.version if st.driver else 0,
            )
        except AlreadyRunning:  # another supervisor (another host's) started it a moment ago
            return Supervised(status(pipeline, offsets))
        except IntentChanged as exc:  # a person stopped it after this pass read its record
            return Supervised(status(pipeline, offsets), note=str(exc))
        return Supervised(st, started)
    return Supervised(st)
