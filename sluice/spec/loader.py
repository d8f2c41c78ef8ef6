"""Reading spec files into validated pipelines, and the checks that need more than one field.

A spec file is untrusted text (:mod:`sluice.spec.files`); string values may use ``${NAME}``
or ``${NAME:-default}`` (besides the environment, ``SLUICE_HOME`` and
``SLUICE_KAFKA_BOOTSTRAP`` are always defined); a relative schema path is taken from the
spec's folder first, then from ``schemas/``. After the model validates, the checks here
look at the schema, the flattened plan, the paths, and the other specs of the folder.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sluice import config
from sluice.spec import eventtime, files, registry, sqlcheck, strict
from sluice.spec.derived import DerivedError, TableSource
from sluice.spec.flatten import FlattenError
from sluice.spec.pipeline import BROKERS, Pipeline, PipelineSpec, SpecError
from sluice.spec.registry import RegistrySchema
from sluice.spec.rescue import rescuable
from sluice.spec.schema import Array, Atomic, SchemaError, Struct, load_schema, parse_json_schema

#: Where a registry subject's Spark schema file comes from (see :mod:`sluice.spec.registry`).
SchemaSource = Callable[[RegistrySchema], Path]

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _interpolate(node: Any, file: Path, where: str = "") -> Any:
    if isinstance(node, dict):
        return {k: _interpolate(v, file, f"{where}.{k}" if where else str(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, file, f"{where}[{i}]") for i, v in enumerate(node)]
    if not isinstance(node, str):
        return node
    env = config.interpolation_env() | dict(os.environ)

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise SpecError(file, where, f"${{{name}}} is not set (set it, or write ${{{name}:-default}})")

    return _VAR.sub(sub, node)


def find_spec(name_or_path: str | Path) -> Path:
    """A spec by path, or by pipeline name in the pipelines folder."""
    p = Path(name_or_path)
    if p.is_file():
        return p.resolve()
    candidate = config.pipelines_dir() / f"{name_or_path}.yaml"
    if candidate.is_file():
        return candidate.resolve()
    known = sorted(s.stem for s in config.pipelines_dir().glob("*.yaml"))
    raise SpecError(p, "", f"no such spec file, nor a pipeline of that name (known: {', '.join(known) or 'none'})")


def _schema_file(spec_path: Path, schema: str) -> Path:
    p = Path(schema)
    if p.is_absolute():
        return p
    for base in (spec_path.parent, config.schemas_dir(), config.schemas_dir().parent):
        if (base / p).is_file():
            return (base / p).resolve()
    return (spec_path.parent / p).resolve()


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    # The source's union tag ('kafka' or 'table') is pydantic's, not a field of the spec.
    loc = tuple(p for i, p in enumerate(loc) if not (i and loc[i - 1] == "source" and p in ("kafka", "table")))
    # So is the schema's: a file name ('str') or a registry subject ('RegistrySchema').
    loc = tuple(p for i, p in enumerate(loc) if not (i and loc[i - 1] == "schema" and p in ("str", "RegistrySchema")))
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out.replace("schema_path", "schema")


def _platform() -> dict[str, str]:
    """What a spec leaves to the platform it runs on: the brokers of a Kafka source."""
    return {BROKERS: config.bootstrap_servers()}


def parse_pipeline(
    data: Any, spec_path: Path, seen: tuple[str, ...] = (), schemas: SchemaSource = registry.cached_file
) -> Pipeline:
    """Validate an already-read spec mapping (from YAML, or a DAG run's parameters). A registry
    subject's schema comes from ``schemas``: this host's cache unless the caller passes the
    adapter (:mod:`sluice.registry`)."""
    if not isinstance(data, dict):
        raise SpecError(spec_path, "", "a spec is a YAML mapping (name:, source:, schema:, ...)")
    data = _interpolate(data, spec_path)
    try:
        spec = PipelineSpec.model_validate(data, context=_platform())
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            if err["loc"][:2] == ("schema", "str") and isinstance(err.get("input"), dict):
                continue  # a registry subject: its own errors say what is wrong with it
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] != "missing" and "input" in err and not isinstance(err["input"], (dict, list)):
                shown = repr(err["input"])
                msg += f" (got {shown if len(shown) <= 80 else shown[:77] + '...'})"
            problems.append((_field_path(err["loc"]), msg))
        raise SpecError(spec_path, *problems[0], more=problems[1:]) from None
    _check_paths(spec, spec_path)
    if isinstance(spec.source, TableSource):
        return _derived(spec, spec_path, spec.source, seen, schemas)

    assert spec.schema_path is not None  # checked by PipelineSpec
    try:
        if isinstance(spec.schema_path, RegistrySchema):
            schema_file = schemas(spec.schema_path)
        else:
            schema_file = _schema_file(spec_path, spec.schema_path)
        schema = load_schema(schema_file)
    except SchemaError as exc:
        raise SpecError(spec_path, "schema", str(exc)) from None
    pipeline = Pipeline(spec, spec_path, schema_file, schema)
    _check_event_time(pipeline)
    try:
        _ = pipeline.plan
    except FlattenError as exc:
        raise SpecError(spec_path, exc.field, str(exc)) from None
    _check_continuous_columns(pipeline)
    _check_rescue(pipeline)
    _check_coerce(pipeline)
    if pipeline.derived:
        _check_derivation(pipeline, "it")
    _check_expectations(pipeline)
    return pipeline


def _check_derivation(pipeline: Pipeline, source: str) -> None:
    """A derived spec's sections against the columns it reads."""
    spec, spec_path = pipeline.spec, pipeline.spec_path
    try:
        pipeline.derivation.check()
    except DerivedError as exc:
        raise SpecError(spec_path, exc.field, str(exc)) from None
    if pipeline.upstream is None and spec.flatten.explode:
        raise SpecError(
            spec_path,
            "flatten.explode",
            "event-time work counts records; exploding turns one into many. Land the topic in a table "
            "and derive from it (source: {table: ...}), where the rows are what you count",
        )
    if spec.expectations.declared:
        raise SpecError(
            spec_path,
            "expectations",
            f"expectations are checked on tables of events; declare them on {source} without the "
            "event-time sections (derived tables are not validated yet)",
        )


def _upstream_spec(spec_path: Path, name: str) -> Path | None:
    """The spec named ``name`` beside ``spec_path`` (its file is usually ``<name>.yaml``)."""
    folder = spec_path.parent
    if (folder / f"{name}.yaml").is_file():
        return folder / f"{name}.yaml"
    for candidate in sorted(folder.glob("*.yaml")):
        try:
            data = files.load_yaml(files.read_text(candidate, limit=files.MAX_SPEC_BYTES))
        except files.FileProblem:
            continue
        if isinstance(data, dict) and data.get("name") == name:
            return candidate
    return None


def _derived(
    spec: PipelineSpec, spec_path: Path, source: TableSource, seen: tuple[str, ...], schemas: SchemaSource
) -> Pipeline:
    """A derived pipeline: its upstream spec, loaded, and its sections checked against that table."""
    if source.table == spec.name or source.table in seen:
        chain = " -> ".join([*seen, spec.name, source.table])
        raise SpecError(spec_path, "source.table", f"pipelines cannot derive from themselves ({chain})")
    found = _upstream_spec(spec_path, source.table)
    if found is None:
        raise SpecError(spec_path, "source.table", f"no pipeline {source.table!r} in {spec_path.parent}")
    try:
        upstream = load_pipeline(found, seen=(*seen, spec.name), schemas=schemas)
    except SpecError as exc:
        raise SpecError(spec_path, "source.table", f"{source.table} cannot be read: {exc}") from None
    if upstream.spec.sink.format == "kafka":
        raise SpecError(
            spec_path,
            "source.table",
            f"{source.table} writes to Kafka, not a table; derive from the pipeline that lands it",
        )
    if upstream.spec.mode == "continuous":
        raise SpecError(spec_path, "source.table", f"{source.table} is a continuous branch; it writes no table")
    if upstream.derived and upstream.spec.output_mode == "update" and source.on_upstream_change != "skip":
        raise SpecError(
            spec_path,
            "source.on_upstream_change",
            f"{source.table} writes in output_mode update: each batch rewrites rows of its table, which a "
            f"stream cannot follow. Derive from {source.table}'s own source instead, or set "
            "on_upstream_change: skip to read only the commits that add rows",
        )
    pipeline = Pipeline(spec, spec_path, upstream.schema_file, upstream.schema, upstream=upstream)
    _check_derivation(pipeline, f"the upstream pipeline {source.table}")
    return pipeline


def _check_paths(spec: PipelineSpec, spec_path: Path) -> None:
    """Tables and checkpoints stay under $SLUICE_STORE (by default $SLUICE_HOME), unless the
    spec allows external paths."""
    home = Path(config.store()) if "://" not in config.store() else None
    paths = [("sink.path", spec.sink.path), ("sink.quarantine_path", spec.sink.quarantine_path)]
    for field, path in [*paths, ("checkpoint", spec.checkpoint)]:
        if path is None or "://" in path:
            continue
        if home is None:  # a store on S3: a relative path must stay under it
            if Path(path).is_absolute() and not spec.allow_external_paths:
                raise SpecError(spec_path, field, f"{path!r} is outside SLUICE_STORE ({config.store()})")
            if os.path.normpath(path).startswith(".."):
                raise SpecError(spec_path, field, f"{path!r} leads outside SLUICE_STORE ({config.store()})")
            continue
        resolved = Path(os.path.normpath(home / path))  # an absolute path replaces home
        if resolved == home or home in resolved.parents:
            continue
        if Path(path).is_absolute():
            if not spec.allow_external_paths:
                raise SpecError(
                    spec_path,
                    field,
                    f"{path!r} is outside SLUICE_HOME ({home}); set allow_external_paths: true to use it",
                )
            if resolved == Path(resolved.anchor):
                raise SpecError(spec_path, field, f"{path!r} is the root of the filesystem")
        else:
            raise SpecError(spec_path, field, f"{path!r} leads outside SLUICE_HOME ({home})")


def _check_expectations(p: Pipeline) -> None:
    e = p.spec.expectations
    if p.spec.mode == "continuous" and e.declared:
        raise SpecError(
            p.spec_path,
            "expectations",
            "a continuous branch writes no table; flag records with continuous.rules, and declare "
            "expectations on the pipeline that lands the verdicts",
        )
    by_name = {c.name: c for c in p.plan.columns}
    known = ", ".join(p.plan.names)
    for name, rule in e.rows.items():
        if rule.sql is not None and (wrong := sqlcheck.problem(rule.sql, p.plan.names)):
            raise SpecError(p.spec_path, f"expectations.rows.{name}.sql", wrong)
        if rule.sql is not None and rule.action == "drop" and (bad := sqlcheck.nondeterministic(rule.sql)):
            raise SpecError(
                p.spec_path,
                f"expectations.rows.{name}.sql",
                f"{', '.join(bad)} is not deterministic: a drop rule decides which table a record goes to, "
                "and a batch read again (after a crash, or to quarantine its rejects) must split the same way; "
                "make it a warn rule, or compare with a fixed value",
            )
    for name, column in [*e.row_columns().items(), *((n, r.unique) for n, r in e.table.items() if r.unique)]:
        where = f"expectations.{'rows' if name in e.rows else 'table'}.{name}"
        if column not in by_name:
            raise SpecError(p.spec_path, where, f"no column {column!r} (columns: {known})")
        if name in e.rows and "[]" in by_name[column].source:
            raise SpecError(
                p.spec_path,
                where,
                f"{column!r} comes from an exploded array; row rules check whole records, so use "
                "a column outside the array",
            )


def _check_continuous_columns(p: Pipeline) -> None:
    c = p.spec.continuous
    if c is None:
        return
    for field, expr in [("continuous.filter", c.filter), *((f"continuous.rules.{k}", v) for k, v in c.rules.items())]:
        if expr and (wrong := sqlcheck.problem(expr, p.plan.names)):
            raise SpecError(p.spec_path, field, wrong)
    names = set(p.plan.names)
    for i, column in enumerate(c.columns):
        if column not in names:
            raise SpecError(
                p.spec_path, f"continuous.columns[{i}]", f"no column {column!r} (columns: {', '.join(p.plan.names)})"
            )
    if c.key and c.key not in names:
        raise SpecError(p.spec_path, "continuous.key", f"no column {c.key!r} (columns: {', '.join(p.plan.names)})")


def _check_rescue(p: Pipeline) -> None:
    for dotted, action in p.spec.on_type_mismatch.items():
        where = f"on_type_mismatch.{dotted}"
        if p.schema.find(dotted) is None:
            raise SpecError(p.spec_path, where, f"no field {dotted!r} in the schema (outside arrays)")
        if action != "rescue":
            continue
        if dotted == p.event_time.field:
            raise SpecError(p.spec_path, where, "the event time cannot be rescued: a row without one has no date")
        wrong = rescuable(p.schema, dotted)
        if wrong:
            raise SpecError(p.spec_path, where, wrong)
    if p.rescue_fields and p.spec.sink.format == "kafka":
        raise SpecError(
            p.spec_path, "on_type_mismatch", "rescue needs a table sink: a Kafka sink has no _rescued column"
        )


def _check_coerce(p: Pipeline) -> None:
    for dotted, c in p.spec.coerce.items():
        where = f"coerce.{dotted}"
        found = p.schema.find(dotted)
        if found is None:
            raise SpecError(p.spec_path, where, f"no field {dotted!r} in the schema (outside arrays)")
        if dotted == p.event_time.field:
            raise SpecError(p.spec_path, where, "the event time is read by event_time.format, not coerced")
        if not isinstance(found.type, Atomic):
            raise SpecError(p.spec_path, where, f"{dotted!r} has type {found.type.sql()}: only simple types coerce")
        for option in c.model_fields_set:
            if not strict.applicable(option, found.type):
                takes = ", ".join(strict.FITS[option]).upper()
                raise SpecError(
                    p.spec_path, f"{where}.{option}", f"applies to {takes}, {dotted!r} is {found.type.sql()}"
                )


def _check_event_time(p: Pipeline) -> None:
    et = p.event_time
    target = p.schema.find(et.field)
    if target is None:
        raise SpecError(
            p.spec_path, "event_time.field", f"no field {et.field!r} in {p.schema_file.name} (outside arrays)"
        )
    if isinstance(target.type, (Struct, Array)):
        raise SpecError(p.spec_path, "event_time.field", f"{et.field!r} is a {target.type.sql()}, not a time value")
    try:
        eventtime.check_type(et.format, target.type)
    except ValueError as exc:
        raise SpecError(p.spec_path, "event_time.format", str(exc)) from None


def load_pipeline(
    name_or_path: str | Path, seen: tuple[str, ...] = (), schemas: SchemaSource = registry.cached_file
) -> Pipeline:
    """Read, interpolate and validate a spec file; raise :class:`SpecError` if it cannot run."""
    path = find_spec(name_or_path)
    try:
        data = files.load_yaml(files.read_text(path, limit=files.MAX_SPEC_BYTES))
    except files.FileProblem as exc:
        raise SpecError(path, exc.where, str(exc)) from None
    return parse_pipeline(data, path, seen, schemas)


def spec_files() -> list[Path]:
    return sorted(config.pipelines_dir().glob("*.yaml"))


def load_all(
    paths: list[Path] | None = None, schemas: SchemaSource = registry.cached_file
) -> list[tuple[Path, Pipeline | SpecError]]:
    """Every spec, loaded, in file order; a spec whose name, table or checkpoint an earlier
    one already has becomes an error naming both files (two DAGs cannot share an id, and
    two streams cannot share a table or a checkpoint)."""
    out: list[tuple[Path, Pipeline | SpecError]] = []
    owners: dict[tuple[str, str], Path] = {}
    for path in spec_files() if paths is None else paths:
        try:
            p = load_pipeline(path, schemas=schemas)
        except SpecError as exc:
            out.append((path, exc))
            continue
        keys = [("name", p.name), ("checkpoint", p.checkpoint_path)]
        if p.spec.sink.format != "kafka":
            keys += [("table", p.sink_path), ("table", p.quarantine_path)]
        clash = next(((what, value) for what, value in keys if (what, value) in owners), None)
        if clash is not None:
            what, value = clash
            out.append(
                (
                    path,
                    SpecError(
                        path, "", f"the {what} {value!r} is already {owners[clash]}'s; give each pipeline its own"
                    ),
                )
            )
            continue
        owners.update({k: path for k in keys})
        out.append((path, p))
    return out


def all_pipelines(schemas: SchemaSource = registry.cached_file) -> list[Pipeline]:
    """Every spec in the pipelines folder, validated (the first invalid one raises)."""
    pipelines = []
    for _, loaded in load_all(schemas=schemas):
        if isinstance(loaded, SpecError):
            raise loaded
        pipelines.append(loaded)
    return pipelines


def valid_pipelines(schemas: SchemaSource = registry.cached_file) -> tuple[list[Pipeline], list[SpecError]]:
    """Every spec in the pipelines folder that validates, and the errors of those that do not:
    for commands that serve the good ones and report the rest."""
    loaded = [x for _, x in load_all(schemas=schemas)]
    return [p for p in loaded if isinstance(p, Pipeline)], [e for e in loaded if isinstance(e, SpecError)]


def recorded(pipeline: Pipeline) -> dict[str, Any]:
    """What a checkpoint keeps of the spec its batches are planned under (see :func:`restore`)."""
    return {
        "spec": pipeline.spec.model_dump(mode="json", by_alias=True),
        "schema": json.loads(pipeline.schema.to_spark_json()),
    }


def restore(record: dict[str, Any], now: Pipeline) -> Pipeline:
    """The pipeline a batch was planned under, from its :func:`recorded` spec, writing where
    ``now`` writes: a batch a crash interrupted is replayed under it, into the same tables."""
    where = {k: getattr(now.spec, k) for k in ("name", "source", "sink", "checkpoint", "allow_external_paths")}
    spec = PipelineSpec.model_validate(record["spec"], context=_platform()).model_copy(update=where)
    schema = parse_json_schema(json.dumps(record["schema"]), "the checkpoint's recorded schema")
    return Pipeline(spec, now.spec_path, now.schema_file, schema)
