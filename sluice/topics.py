"""Topic administration and offsets, with confluent-kafka's AdminClient and Consumer."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.records.preview import Sampled

# librdkafka reports every failed connection attempt (dozens a second when the broker is
# down); Sluice reports the outcome once, so the client's own log stays out of the terminal.
_client_log = logging.getLogger("sluice.kafka.client")
_client_log.addHandler(logging.NullHandler())
_client_log.propagate = False


def kafka_reason(exc: KafkaException) -> str:
    """librdkafka's own words for what went wrong (its KafkaError), without the error's repr."""
    first: Any = exc.args[0] if exc.args else None
    return str(first.str()) if hasattr(first, "str") else str(exc)


def _conf(bootstrap: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "logger": _client_log, **extra}


def _consumer(bootstrap: str) -> Consumer:
    return Consumer(_conf(bootstrap, **{"group.id": "sluice-offsets", "enable.auto.commit": False}))


@dataclass(frozen=True)
class TopicResult:
    name: str
    partitions: int
    created: bool  # False: it existed already


def create_topics(bootstrap: str, names: list[str], partitions: int = 1, timeout: float = 30.0) -> list[TopicResult]:
    """Create topics that do not exist yet (idempotent); report each one's partitions. Their
    copies and ``min.insync.replicas`` are the brokers' defaults: one on the embedded broker,
    three (two in sync) on the cluster layout's."""
    admin = AdminClient(_conf(bootstrap))
    existing = admin.list_topics(timeout=timeout).topics
    wanted = [n for n in names if n not in existing]
    created: set[str] = set()
    if wanted:
        futures = admin.create_topics(
            [NewTopic(n, num_partitions=partitions, replication_factor=-1) for n in wanted],
            operation_timeout=timeout,
        )
        for name, fut in futures.items():
            try:
                fut.result()
                created.add(name)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
    # On a cluster the broker asked next may learn of a new topic a moment after the
    # controller made it: wait until each one shows its partitions.
    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(timeout=timeout).topics
        if all(n in md and md[n].partitions for n in names) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return [TopicResult(n, len(md[n].partitions) if n in md else 0, n in created) for n in names]


def partition_count(bootstrap: str, topic: str, timeout: float = 10.0) -> int:
    admin = AdminClient(_conf(bootstrap))
    md = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    if md is None or md.error is not None:
        raise KafkaException(f"topic {topic!r} does not exist")
    return len(md.partitions)


def total_partitions(bootstrap: str, topics: list[str]) -> int:
    """Partitions across ``topics``: a continuous query runs one long-lived task per partition."""
    return sum(partition_count(bootstrap, t) for t in topics)


def list_topics(bootstrap: str, timeout: float = 10.0) -> list[str]:
    admin = AdminClient(_conf(bootstrap))
    return sorted(t for t in admin.list_topics(timeout=timeout).topics if not t.startswith("__"))


def watermarks(bootstrap: str, topic: str, timeout: float = 10.0) -> dict[int, tuple[int, int]]:
    """(first offset still in the log, next offset to be written), per partition."""
    consumer = _consumer(bootstrap)
    try:
        md = consumer.list_topics(topic, timeout=timeout)
        if topic not in md.topics or md.topics[topic].error is not None:
            raise KafkaException(f"topic {topic!r} does not exist")
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            for p in md.topics[topic].partitions
        }
    finally:
        consumer.close()


def offsets_for_time(bootstrap: str, topic: str, epoch_ms: int, timeout: float = 10.0) -> dict[int, int | None]:
    """Per partition, the first offset whose record timestamp is at or after ``epoch_ms``
    (None when every record is older)."""
    consumer = _consumer(bootstrap)
    try:
        md = consumer.list_topics(topic, timeout=timeout)
        if topic not in md.topics or md.topics[topic].error is not None:
            raise KafkaException(f"topic {topic!r} does not exist")
        wanted = [TopicPartition(topic, p, epoch_ms) for p in md.topics[topic].partitions]
        found = consumer.offsets_for_times(wanted, timeout=timeout)
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in found}
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str, timeout: float = 10.0) -> dict[int, int]:
    """The next offset to be written, per partition: Spark never commits offsets to Kafka,
    so lag is measured against these."""
    consumer = _consumer(bootstrap)
    try:
        md = consumer.list_topics(topic, timeout=timeout)
        if topic not in md.topics or md.topics[topic].error is not None:
            raise KafkaException(f"topic {topic!r} does not exist")
        out = {}
        for p in md.topics[topic].partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            out[p] = high
        return out
    finally:
        consumer.close()


def sample_plan(available: dict[tuple[str, int], tuple[int, int]], n: int) -> dict[tuple[str, int], tuple[int, int]]:
    """The newest ``n`` records, spread over the partitions: ``[start, end)`` per partition.

    ``available`` is each partition's (first offset still in the log, next offset). Each
    partition gets a share in turn, so a sample of a keyed topic is not all one key's; a
    partition with fewer records leaves its share to the others.
    """
    counts = dict.fromkeys(available, 0)
    left = n
    while left > 0:
        growing = [tp for tp, (low, high) in sorted(available.items()) if counts[tp] < high - low]
        if not growing:
            break
        for tp in growing[:left]:
            counts[tp] += 1
        left -= min(left, len(growing))
    return {tp: (available[tp][1] - k, available[tp][1]) for tp, k in counts.items() if k}


def sample(
    bootstrap: str, topics: list[str], n: int, isolation: str = "read_uncommitted", timeout: float = 30.0
) -> list[Sampled]:
    """The newest ``n`` records of the topics (see :func:`sample_plan`), read without joining a
    consumer group or committing an offset, oldest first per partition.

    ``isolation``: the stream's ``kafka.isolation.level`` (Spark reads uncommitted records by
    default, librdkafka committed ones only). Raises KafkaException when the records do not
    all arrive within ``timeout``: a shorter sample than asked would pass for the topic's."""
    settings = {"group.id": "sluice-preview", "enable.auto.commit": False, "isolation.level": isolation}
    consumer = Consumer(_conf(bootstrap, **settings))
    try:
        available = {}
        for topic in topics:
            md = consumer.list_topics(topic, timeout=timeout)
            if topic not in md.topics or md.topics[topic].error is not None:
                raise KafkaException(f"topic {topic!r} does not exist")
            for p in md.topics[topic].partitions:
                available[(topic, p)] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
        plan = sample_plan(available, n)
        if not plan:
            return []
        consumer.assign([TopicPartition(t, p, start) for (t, p), (start, _) in plan.items()])
        open_ = dict(plan)
        out = []
        deadline = time.monotonic() + timeout
        while open_ and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=1.0):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                tp, offset = (str(msg.topic()), int(msg.partition() or 0)), int(msg.offset() or 0)
                if tp not in open_ or offset >= open_[tp][1]:
                    continue
                out.append(Sampled(tp[0], tp[1], offset, msg.timestamp()[1], msg.key(), msg.value()))
                if offset >= open_[tp][1] - 1:
                    del open_[tp]
            # A transaction's marker or a compacted gap can end a partition without a record.
            for tp in list(open_):
                position = consumer.position([TopicPartition(tp[0], tp[1])])[0].offset
                if position >= open_[tp][1]:
                    del open_[tp]
        if open_:
            missing = ", ".join(f"{t}[{p}]" for t, p in sorted(open_))
            raise KafkaException(
                f"read {len(out)} of the newest records in {timeout:.0f} s; still waiting for {missing}"
            )
        return sorted(out, key=lambda r: (r.topic, r.partition, r.offset))
    finally:
        consumer.close()
