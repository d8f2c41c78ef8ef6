"""The documentation site's generated parts, and the MkDocs hook that puts them in place.

Two reference pages are written from what they describe, so they cannot drift from it: the
spec reference from the spec's JSON Schema (the one ``sluice check --schema`` prints, each
field described by its docstring in :mod:`sluice.spec`), and the CLI reference from the
``sluice`` command itself (Typer's own ``utils docs``). A page asks for one with a marker
line; :func:`on_page_markdown` is the hook ``mkdocs.yml`` names. The benchmarks' plots are
added to the site from ``benchmarks/results/``, where the benchmarks save them.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from sluice.spec.pipeline import PipelineSpec

ROOT = Path(__file__).resolve().parents[2]
SPEC_MARKER = "<!-- sluice:spec-reference -->"
CLI_MARKER = "<!-- sluice:cli-reference -->"
MODULES_MARKER = "<!-- sluice:modules -->"
#: The folders whose modules the architecture page lists, in its order.
PACKAGES = (
    "sluice/spec",
    "sluice/records",
    "sluice/state",
    "sluice/storage",
    "sluice/ops",
    "sluice/sql",
    "sluice/airflow",
    "sluice/cli",
    "sluice/dev",
    "sluice",
    "jobs",
    "jobs/stream",
    "jobs/tables",
    "jobs/quality",
    "jobs/sql",
    "benchmarks",
)
TOP = "PipelineSpec"


def _text(description: str) -> str:
    """A docstring as one Markdown line: reST's ``code`` and :role:`x` become `code`."""
    text = " ".join(description.split())
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`").replace("|", "\\|")


def _anchor(name: str) -> str:
    return "top-level" if name == TOP else name.lower()


def _type(node: dict[str, Any]) -> str:
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_anchor(name)})"
    for union in ("anyOf", "oneOf"):
        if union in node:
            parts = [p for p in node[union] if p.get("type") != "null"]
            text = " or ".join(_type(p) for p in parts)
            return f"{text} or null" if len(parts) < len(node[union]) else text
    if "allOf" in node and len(node["allOf"]) == 1:
        return _type(node["allOf"][0])
    if "enum" in node:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    kind = node.get("type")
    if kind == "array":
        return f"list of {_type(node.get('items', {}))}"
    if kind == "object":
        values = node.get("additionalProperties") or next(iter(node.get("patternProperties", {}).values()), None)
        return f"map of string to {_type(values)}" if isinstance(values, dict) else "map"
    text = {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean"}.get(str(kind), "any")
    limits = []
    if "pattern" in node:
        limits.append(f"matching `{node['pattern']}`")
    if "minLength" in node:
        limits.append("not empty")
    for key, word in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤")):
        if key in node:
            limits.append(f"{word} {node[key]}")
    return f"{text} ({', '.join(limits)})" if limits else text


def _default(node: dict[str, Any], required: bool) -> str:
    if required:
        return "**required**"
    if "default" not in node:
        return ""
    value = node["default"]
    if isinstance(value, dict) and value and "$ref" in node:
        return "see its section"
    return f"`{json.dumps(value)}`"


def _sections(schema: dict[str, Any]) -> list[str]:
    """Model names in the order a reader meets them: the top level, then each as first referred to."""
    defs = schema.get("$defs", {})
    order, queue = [TOP], [schema]
    while queue:
        for ref in re.findall(r'"\$ref": "#/\$defs/([^"]+)"', json.dumps(queue.pop(0).get("properties", {}))):
            if ref not in order:
                order.append(ref)
                queue.append(defs[ref])
    return order


def spec_reference() -> str:
    """Markdown: one section per part of the spec, a row per field."""
    schema = PipelineSpec.model_json_schema(by_alias=True)
    defs = {TOP: schema, **schema.get("$defs", {})}
    out: list[str] = []
    for name in _sections(schema):
        model = defs[name]
        title = "Top level" if name == TOP else name
        out += [f"## {title}", "", _text(model.get("description", "")), ""]
        out += ["| Key | Type | Default | Meaning |", "|---|---|---|---|"]
        required = set(model.get("required", []))
        for key, node in model.get("properties", {}).items():
            meaning = _text(node.get("description", ""))
            out.append(f"| `{key}` | {_type(node)} | {_default(node, key in required)} | {meaning} |")
        out.append("")
    return "\n".join(out)


def cli_reference() -> str:
    """Markdown of every ``sluice`` command and option, as Typer documents the app."""
    done = subprocess.run(
        [sys.executable, "-m", "typer", "sluice.cli", "utils", "docs", "--name", "sluice"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    # Its first line is a title of its own (the page has one), and its sections go one level down.
    body = done.stdout.split("\n", 1)[1].strip()
    return re.sub(r"^(#+) ", r"#\1 ", body, flags=re.MULTILINE) + "\n"


def summary(path: Path) -> str:
    """A module's docstring up to its first blank line, as one Markdown line."""
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    return _text(docstring.split("\n\n", 1)[0])


def modules() -> str:
    """Markdown: a table per package, a row per module with the first paragraph of its docstring."""
    out: list[str] = []
    for package in PACKAGES:
        files = sorted(p for p in (ROOT / package).glob("*.py") if p.stem not in ("__init__", "__main__"))
        init = ROOT / package / "__init__.py"
        lead = summary(init) if package != "sluice" and init.is_file() else ""
        out += [f"### `{package}/`", "", *([lead, ""] if lead else []), "| module | what it is |", "|---|---|"]
        out += [f"| `{p.name}` | {summary(p)} |" for p in files]
        out.append("")
    return "\n".join(out)


# --- the MkDocs hook -------------------------------------------------------------------------


def on_page_markdown(markdown: str, **_: Any) -> str:
    if SPEC_MARKER in markdown:
        markdown = markdown.replace(SPEC_MARKER, spec_reference())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    if MODULES_MARKER in markdown:
        markdown = markdown.replace(MODULES_MARKER, modules())
    return markdown


def on_files(files: Any, config: Any, **_: Any) -> Any:
    from mkdocs.structure.files import File

    for plot in sorted((ROOT / "benchmarks" / "results").glob("*.png")):
        files.append(File.generated(config, f"benchmarks/{plot.name}", abs_src_path=str(plot)))
    return files
