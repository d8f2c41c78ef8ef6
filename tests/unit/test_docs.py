"""The documentation: generated references complete, links that resolve, names that exist.

The site itself is built with ``mkdocs build --strict`` by ``make docs`` (part of the README's
test command), which fails on a broken link or anchor inside ``docs/``. These check what the
build cannot: the README's own links, every field and command being described, and the
tests and modules the prose and the comments name.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import typer

from sluice.cli import app
from sluice.dev import docs
from sluice.spec.pipeline import PipelineSpec

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("sluice", "jobs", "dags", "benchmarks", "tests", "docs")
TEST_REF = re.compile(r"tests/(?:unit|integration|e2e)/[A-Za-z0-9_]+\.py(?:::[A-Za-z0-9_]+)?")


def _defs() -> dict[str, dict]:
    schema = PipelineSpec.model_json_schema(by_alias=True)
    return {docs.TOP: schema, **schema["$defs"]}


def test_every_key_of_the_spec_is_described_in_the_reference() -> None:
    text = docs.spec_reference()
    for name, model in _defs().items():
        assert model.get("description"), f"{name} has no docstring"
        section = text.split(f"## {'Top level' if name == docs.TOP else name}\n", 1)[1].split("\n## ", 1)[0]
        for key, node in model.get("properties", {}).items():
            assert node.get("description"), f"{name}.{key} has no docstring (the spec reference shows it)"
            assert f"| `{key}` |" in section, f"{name}.{key} is missing from its section"


def test_the_reference_links_each_part_to_its_section() -> None:
    text = docs.spec_reference()
    assert "| `sink` | [Sink](#sink) | **required** |" in text
    assert '| `mode` | `"micro_batch"` \\| `"continuous"` | `"micro_batch"` |' in text
    # reST's roles and double backquotes become Markdown code.
    assert ":mod:" not in text and "``" not in text


def _commands(group: object, prefix: str) -> list[str]:
    out = []
    for name, command in getattr(group, "commands", {}).items():
        out.append(f"{prefix} {name}")
        out += _commands(command, f"{prefix} {name}")
    return out


def test_the_cli_reference_has_every_command() -> None:
    text = docs.cli_reference()
    commands = _commands(typer.main.get_command(app), "sluice")
    assert len(commands) > 20
    for command in commands:
        assert f"### `{command}`" in text or f"#### `{command}`" in text, command
    assert not text.startswith("# "), "the page has its own title"


def test_the_readme_is_short_and_its_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 100, "the README is the front door; the depth goes to docs/"
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).is_file(), f"README links to {target}, which does not exist"
    # The tour is included in the site by its section markers (pymdownx.snippets).
    assert "[start:tour]" in readme and "[end:tour]" in readme


def test_every_named_test_exists() -> None:
    named = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in (".py", ".md") and path.is_file():
                named += [(path, ref) for ref in TEST_REF.findall(path.read_text())]
    named += [(ROOT / "README.md", ref) for ref in TEST_REF.findall((ROOT / "README.md").read_text())]
    assert len(named) > 20
    for where, ref in named:
        file, _, name = ref.partition("::")
        assert (ROOT / file).is_file(), f"{where.relative_to(ROOT)} names {file}, which does not exist"
        if name:
            tree = ast.parse((ROOT / file).read_text())
            defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)}
            assert name in defined, f"{where.relative_to(ROOT)} names {ref}, which does not exist"


def test_every_module_says_what_it_is() -> None:
    """The architecture page lists each module by its docstring's first paragraph."""
    listed = docs.modules()
    for package in docs.PACKAGES:
        for path in (ROOT / package).glob("*.py"):
            if path.stem in ("__init__", "__main__"):
                continue
            assert docs.summary(path), f"{path.relative_to(ROOT)} has no docstring"
            assert f"| `{path.name}` |" in listed
    packages = {
        str(p.parent.relative_to(ROOT))
        for p in [*ROOT.glob("sluice/**/__init__.py"), *ROOT.glob("jobs/**/__init__.py")]
    }
    assert packages <= set(docs.PACKAGES), "a new package is missing from the architecture page"
    assert "<!-- sluice:modules -->" in (ROOT / "docs" / "architecture.md").read_text()
