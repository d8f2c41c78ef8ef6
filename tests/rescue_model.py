"""What ``_rescued`` must hold for a record, worked out in plain Python from the rules in
:mod:`sluice.spec.rescue`, so the tests compare Spark's column with an independent answer."""

from __future__ import annotations

from typing import Any

from sluice.spec.rescue import display
from sluice.spec.schema import Array, DataType, Map, Struct


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _has_struct(t: DataType) -> bool:
    if isinstance(t, Array):
        return _has_struct(t.element)
    if isinstance(t, Map):
        return _has_struct(t.value)
    return isinstance(t, Struct)


def undeclared(t: DataType, value: Any, path: str = "") -> dict[str, Any]:
    """Every field of ``value`` that ``t`` does not declare, by its path."""
    out: dict[str, Any] = {}
    if isinstance(t, Struct) and isinstance(value, dict):
        names = {f.name for f in t.fields}
        out |= {_join(path, display(k)): v for k, v in value.items() if k not in names}
        for f in t.fields:
            if f.name in value and _has_struct(f.type):
                out |= undeclared(f.type, value[f.name], _join(path, display(f.name)))
    elif isinstance(t, Array) and isinstance(value, list):
        for i, element in enumerate(value):
            out |= undeclared(t.element, element, f"{path}[{i}]")
    elif isinstance(t, Map) and isinstance(value, dict):
        for key, element in value.items():
            out |= undeclared(t.value, element, f"{path}[{key}]")
    return out
