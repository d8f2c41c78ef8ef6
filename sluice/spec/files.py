"""Reading spec and schema files as untrusted input: text only, YAML without surprises.

A spec comes from whoever can write to the pipelines folder, and both the scheduler (every
30 s) and every ``sluice`` command read all of them. So a file that is not UTF-8 text is
refused with one line naming it; YAML aliases are refused (nested aliases expand
exponentially: a few hundred bytes can hold a billion nodes); a key given twice in one
mapping is refused instead of the last one silently winning; and a spec has a size limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode

#: Specs are a few kilobytes; this is far above any real one.
MAX_SPEC_BYTES = 1_000_000


class FileProblem(ValueError):
    """What is wrong with the file, and where (``where`` may be empty)."""

    def __init__(self, where: str, message: str) -> None:
        self.where = where
        super().__init__(message)


def read_text(path: Path, limit: int | None = None) -> str:
    """The file as UTF-8 text; raise :class:`FileProblem` for anything else."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise FileProblem("", f"cannot read it ({exc.strerror})") from None
    if limit is not None and len(data) > limit:
        raise FileProblem("", f"{len(data):,} bytes: larger than {limit:,}, which no spec needs")
    if b"\x00" in data:
        raise FileProblem("", "a binary file, not text (it holds NUL bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise FileProblem(
            f"line {line}", f"not UTF-8 text (byte 0x{data[exc.start]:02x}); save the file as UTF-8"
        ) from None


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader, without aliases and without duplicate keys."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise FileProblem(
                f"line {event.start_mark.line + 1}",
                f"YAML aliases (*{event.anchor}) are not allowed in a spec: write the value out",
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: PyYAML's own error says it well
                break
            seen.setdefault(key, key_node.start_mark.line + 1)
            if first is not None:
                raise FileProblem(
                    f"line {key_node.start_mark.line + 1}", f"the key {key!r} is given twice (first on line {first})"
                )
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """Parse one YAML document; raise :class:`FileProblem` with the line of the problem."""
    try:
        return yaml.load(text, Loader=_SpecLoader)  # noqa: S506 - a SafeLoader subclass
    except FileProblem:
        raise
    except (yaml.YAMLError, ConstructorError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else ""
        raise FileProblem(where, f"not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise FileProblem("", "not valid YAML: nested too deeply") from None
