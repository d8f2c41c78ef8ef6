"""Sending events to Kafka: synthetic ones at a rate, or a newline-delimited JSON file.

Every send is confirmed by the broker (``acks=all``, idempotent producer); a record the
broker did not take fails the command instead of vanishing.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaError, Message, Producer

from sluice.dev.generate import EventGenerator, Record


class ProduceError(RuntimeError):
    pass


@dataclass(frozen=True)
class Delivered:
    partition: int
    offset: int
    record: Record


@dataclass
class ProduceReport:
    topic: str
    sent: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    delivered: list[Delivered] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else 0.0


def producer(bootstrap: str, **overrides: str | int) -> Producer:
    conf: dict[str, str | int] = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        # Errors reach us through delivery reports; librdkafka's retry warnings are noise.
        "log_level": 3,
    }
    return Producer(conf | overrides)


def send(
    bootstrap: str,
    topic: str,
    records: Iterable[Record],
    rate: float | None = None,
    keep: bool = False,
) -> ProduceReport:
    """Send records, at most ``rate`` per second; wait until the broker confirmed all.

    With ``keep``, the report lists where each record landed (partition, offset).
    """
    prod = producer(bootstrap)
    report = ProduceReport(topic)
    errors: list[str] = []

    def on_delivery(record: Record) -> Callable[[KafkaError | None, Message], None]:
        def done(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(str(err))
            elif keep:
                report.delivered.append(Delivered(msg.partition(), msg.offset(), record))  # type: ignore[arg-type]

        return done

    start = time.monotonic()
    for i, record in enumerate(records):
        if rate:
            ahead = start + i / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        while True:
            try:
                prod.produce(topic, value=record.value, on_delivery=on_delivery(record))
                break
            except BufferError:  # local queue full: let deliveries drain
                prod.poll(0.1)
        prod.poll(0)
        report.sent += 1
        report.kinds[record.kind] += 1
    remaining = prod.flush(60)
    report.seconds = time.monotonic() - start
    if remaining:
        errors.append(f"{remaining} records still unconfirmed after 60 s")
    if errors:
        raise ProduceError(f"{len(errors)} of {report.sent} records were not delivered to {topic}: {errors[0]}")
    report.delivered.sort(key=lambda d: (d.partition, d.offset))
    return report


def synthetic(generator: EventGenerator, count: int, bad_fraction: float = 0.0) -> Iterator[Record]:
    for _ in range(count):
        yield generator.record(bad_fraction)


def ndjson_lines(path: Path, stats: Counter[str] | None = None) -> Iterator[tuple[int, bytes]]:
    """Each non-blank line of the file with its line number, as it is but for its line ending
    (the pipeline judges it, not the reader)."""
    with path.open("rb") as fh:
        for number, line in enumerate(fh, start=1):
            line = line.rstrip(b"\r\n")
            if not line.strip():
                if stats is not None:
                    stats["blank lines skipped"] += 1
                continue
            yield number, line


def read_ndjson(path: Path, stats: Counter[str] | None = None) -> Iterator[Record]:
    """Each non-blank line of the file, as ``sluice replay`` sends it."""
    for _, line in ndjson_lines(path, stats):
        yield Record(line, "replayed", None)
