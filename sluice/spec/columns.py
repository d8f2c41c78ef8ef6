"""Every column name Sluice makes up, in one place.

The parse stage's working columns (double underscore) live only inside a batch, between
reading Kafka and writing the tables; the metadata columns (one underscore) are written to
every output table, for lineage and audits.
"""

from __future__ import annotations

# --- the parse stage, in the order a record meets them ------------------------------------
#: The Kafka key and value, as bytes.
KEY = "__key"
VALUE = "__value"
#: The value decoded as text, and what from_json made of it (with its corrupt-record column).
JSON = "__json"
CORRUPT = "__corrupt"
PARSED = "__data"
#: The event time as a timestamp, before it is checked against the accepted bounds.
EVENT_TS = "__event_ts"
#: Why a record goes to quarantine; NULL for a good record.
REASON = "__reason"
#: The record as a VARIANT (read once, for the fields the schema does not declare), and
#: those fields by path (a MAP<STRING, VARIANT>, empty when there are none).
VARIANT = "__variant"
RESCUED_MAP = "__rescued"
#: Expectations: did the record reach the rules, and the record each rule looks at.
CHECKED = "__checked"
RECORD = "__record"

# --- written to every output table ---------------------------------------------------------
KAFKA_TOPIC = "_kafka_topic"
KAFKA_PARTITION = "_kafka_partition"
KAFKA_OFFSET = "_kafka_offset"
KAFKA_TIMESTAMP = "_kafka_timestamp"
EVENT_TIME = "_event_time"
INGESTED_AT = "_ingested_at"
#: The record's fields the schema does not declare (and rescued type mismatches), as JSON
#: by path; NULL when there are none. See :mod:`sluice.spec.rescue`.
RESCUED = "_rescued"
METADATA_COLUMNS = (KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET, KAFKA_TIMESTAMP, EVENT_TIME, INGESTED_AT, RESCUED)
