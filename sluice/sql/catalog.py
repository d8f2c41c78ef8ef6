"""What the catalog holds: each pipeline's table and quarantine as an external table of the
``sluice`` database, by location, with the spec's description as its comment.

Only the statements are made here; ``jobs/sql/catalog.py`` runs them in the Spark session that
owns the metastore.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sluice import config
from sluice.spec import Pipeline
from sluice.spec.compatibility import expected
from sluice.spec.formats import DELTA, TableFormat
from sluice.sql.settings import DATABASE

#: The event log's name in the catalog (its folder is _sluice_events).
EVENTS_TABLE = "sluice_events"


@dataclass(frozen=True)
class CatalogTable:
    name: str  # unqualified: the pipeline's name, or <name>_quarantine
    format: TableFormat
    location: str
    comment: str
    #: Every field the spec writes, nested ones included, as paths (see :func:`field_paths`;
    #: empty when not known): a Parquet table registered without one of them is registered
    #: again once its files have it, since its schema was read from older files.
    columns: frozenset[str] = frozenset()

    @property
    def qualified(self) -> str:
        return f"{quote(DATABASE)}.{quote(self.name)}"

    def create(self) -> str:
        """Registers the table where it is; the schema and partitions come from its files
        (for Parquet, merged over all of them: newer files may have more columns)."""
        merge = "" if self.format.schema_in_log else " OPTIONS (mergeSchema 'true')"
        return (
            f"CREATE TABLE IF NOT EXISTS {self.qualified} USING {self.format.name}{merge} "
            f"LOCATION {literal(self.location)} COMMENT {literal(self.comment)}"
        )

    def drop(self) -> str:
        """Forgets the table; an external table's files stay where they are."""
        return f"DROP TABLE IF EXISTS {self.qualified}"


def catalog_tables(pipelines: list[Pipeline]) -> list[CatalogTable]:
    """The tables of every pipeline that writes tables (a continuous branch writes Kafka)."""
    tables = []
    for p in pipelines:
        fmt = p.table_format
        if fmt is None:
            continue
        about = " ".join(p.spec.description.split()) or f"Events of the {p.name} pipeline."
        owner = f" Owner: {p.spec.owner}."
        columns = field_paths({"type": "struct", "fields": [_as_field(c) for c in p.plan.columns]})
        columns |= frozenset(c.lower() for c in expected(p)[0].columns)  # Sluice's own columns too
        tables.append(CatalogTable(p.name, fmt, p.sink_path, about + owner, columns))
        tables.append(
            CatalogTable(
                p.quarantine_table,
                fmt,
                p.quarantine_path,
                f"Records of the {p.name} pipeline that could not be parsed or failed a rule, "
                f"with the reason and the raw value.{owner}",
            )
        )
    tables.append(
        CatalogTable(
            EVENTS_TABLE,
            DELTA,
            config.events_table(),
            "Every stream's micro-batches as its StreamingQueryListener saw them: input rows, rates, "
            "watermark, state rows and memory, late rows and where the time went.",
        )
    )
    return tables


def _as_field(column: Any) -> dict[str, Any]:
    """A planned output column as a field of Spark's schema JSON."""
    return {"name": column.name, "type": column.type.to_json(), "nullable": True, "metadata": {}}


def field_paths(schema: dict[str, Any] | str) -> frozenset[str]:
    """Every field of a Spark schema (its JSON) at any depth, as a path: ``items``,
    ``items[].sku``, ``attrs{}.unit``. Compared as sets, so the order of a struct's fields,
    which schema merging may change, does not count; names are lower-cased, as the
    catalog's. (A field's type cannot change in place: the spec's compatibility check refuses that.)"""
    node = json.loads(schema) if isinstance(schema, str) else schema
    found: set[str] = set()

    def walk(t: Any, path: str) -> None:
        if path:
            found.add(path)
        if not isinstance(t, dict):
            return
        if t.get("type") == "struct":
            for f in t["fields"]:
                walk(f["type"], f"{path}.{f['name'].lower()}" if path else f["name"].lower())
        elif t.get("type") == "array":
            walk(t["elementType"], f"{path}[]")
        elif t.get("type") == "map":
            walk(t["valueType"], f"{path}{{}}")

    walk(node, "")
    return frozenset(found)


def database_statement() -> str:
    return f"CREATE DATABASE IF NOT EXISTS {quote(DATABASE)} COMMENT 'The tables Sluice pipelines write'"


def quote(identifier: str) -> str:
    return "`" + identifier.replace("`", "``") + "`"


def literal(text: str) -> str:
    """A Spark SQL string literal (backslashes and quotes escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
