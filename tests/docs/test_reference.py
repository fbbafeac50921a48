"""The generated reference pages document everything: every configuration key, every command and flag.

``docs/hooks.py`` writes ``reference/configuration.md`` from the comments of
``spark_storm/defaults.yaml`` and ``reference/cli.md`` from the argparse parsers when the site is
built.  These tests fail, naming it, on a key without a comment above it, a command or a flag
without ``help=``, or a key, command or flag missing from the pages.  No Spark, no servers: they
run in the fast loop (``scripts/test --fast``) too.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from spark_storm.cli.parser import build_parser
from tests.support import ROOT

DEFAULTS = ROOT / "spark_storm" / "defaults.yaml"


def _load_hooks() -> ModuleType:
    """docs/hooks.py, imported by path (``docs`` is not a package; mkdocs loads it the same way)."""
    name = "spark_storm_docs_hooks"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "hooks.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    return _load_hooks()


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


def _yaml_keys(path: Path = DEFAULTS) -> list[str]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return [str(key) for key in data]


def test_every_key_of_defaults_yaml_has_a_meaning(hooks: ModuleType) -> None:
    meanings = {key.name: key.meaning for key in hooks.config_keys()}
    undocumented = [key for key in _yaml_keys() if not meanings.get(key, "").strip()]
    assert not undocumented, (
        f"keys of spark_storm/defaults.yaml with no comment above them (reference/configuration.md "
        f"would show no meaning): {', '.join(undocumented)}"
    )


def test_the_comment_reader_finds_exactly_the_keys_yaml_loads(hooks: ModuleType) -> None:
    # A key the line reader misses (or invents) would silently drop out of the page.
    found = [key.name for key in hooks.config_keys()]
    assert len(found) == len(set(found)), [k for k in found if found.count(k) > 1]
    assert set(found) == set(_yaml_keys())
    assert all(key.section for key in hooks.config_keys()), "a key before the first ### section"


def test_every_command_has_help(hooks: ModuleType, parser: argparse.ArgumentParser) -> None:
    commands = hooks.cli_commands(parser)
    assert "topology plan" in [name for name, _ in commands]  # nested commands are listed too
    undocumented = [name for name, summary in commands if not summary.strip()]
    assert not undocumented, f"spark-storm commands without help= in spark_storm/cli/parser.py: {undocumented}"


def test_every_flag_of_every_command_has_help(hooks: ModuleType, parser: argparse.ArgumentParser) -> None:
    rows = hooks.cli_flags(parser)
    assert len(rows) > 50
    undocumented = [
        f"spark-storm {command} {flag}".replace("  ", " ") for command, flag, text in rows if not text.strip()
    ]
    assert not undocumented, f"flags without help= in spark_storm/cli/parser.py: {undocumented}"


def test_the_configuration_page_shows_every_key_with_its_default(hooks: ModuleType) -> None:
    page = hooks.configuration_page(hooks.config_keys())
    defaults = yaml.safe_load(DEFAULTS.read_text())
    rows = {line.split("|")[1].strip(): line for line in page.splitlines() if line.startswith("| `")}
    missing = [key for key in defaults if f"`{key}`" not in rows]
    assert not missing, f"keys missing from reference/configuration.md: {missing}"
    assert f"{len(defaults)} keys." in page
    assert '| `storm.messaging.transport` | `"tcp"` |' in rows["`storm.messaging.transport`"]


def _sections(page: str) -> dict[str, str]:
    """The cli page's sections by heading: ``Global flags``, ``demo``, ``topology plan``..."""
    out = {}
    for part in page.split("\n## ")[1:]:
        heading, _, body = part.partition("\n")
        out[heading.strip("`")] = body
    return out


def test_the_cli_page_shows_every_command_and_flag(hooks: ModuleType, parser: argparse.ArgumentParser) -> None:
    sections = _sections(hooks.cli_page(parser))
    missing = []
    for command, flag, _ in hooks.cli_flags(parser):
        body = sections.get(command or "Global flags")
        if body is None:
            missing.append(f"the section of {command!r}")
            continue
        shown = [f"`{part}`" for part in flag.split(", ")] if flag.startswith("-") else [f"`{flag}`"]
        missing += [f"{command} {name}" for name in shown if name not in body]
    missing += [f"the section of {name!r}" for name, _ in hooks.cli_commands(parser) if name not in sections]
    assert not missing, f"missing from reference/cli.md: {missing}"
    assert "Commands: `topology plan`." in sections["topology"]


def test_an_undocumented_key_or_flag_is_caught(hooks: ModuleType, tmp_path: Path) -> None:
    # The checks above see a gap as an empty meaning or help: a key with no comment, a key after
    # another key's comment block has ended (blank line), a flag or a command without help=.
    defaults = tmp_path / "defaults.yaml"
    defaults.write_text(
        "### Section\n# Documented.\na.documented: 1\nb.grouped: 2\n\nc.bare: 3\n# Another.\nd.after: {}\n"
    )
    keys = {key.name: key.meaning for key in hooks.config_keys(defaults)}
    assert keys == {"a.documented": "Documented.", "b.grouped": "Documented.", "c.bare": "", "d.after": "Another."}
    assert set(keys) == set(_yaml_keys(defaults))

    parser = argparse.ArgumentParser(prog="x")
    sub = parser.add_subparsers()
    run = sub.add_parser("run", help="run it")
    run.add_argument("--fast", action="store_true", help="quickly")
    run.add_argument("--bare")
    run.add_argument("target")
    sub.add_parser("quiet")
    assert hooks.cli_flags(parser) == [("run", "--fast", "quickly"), ("run", "--bare", ""), ("run", "target", "")]
    assert hooks.cli_commands(parser) == [("run", "run it"), ("quiet", "")]


@pytest.mark.parametrize(
    ("text", "cell"),
    [
        ("a | b", "a \\| b"),
        ("HOST:PORT[,HOST:PORT]", "HOST:PORT\\[,HOST:PORT\\]"),
        ("topic <prefix><topology>", "topic &lt;prefix>&lt;topology>"),
        ("`--zookeeper H[,H][/chroot]` or [x]", "`--zookeeper H[,H][/chroot]` or \\[x\\]"),
    ],
    ids=["pipe", "brackets", "angle-brackets", "code-span-as-written"],
)
def test_table_cells_escape_markdown_outside_code_spans(hooks: ModuleType, text: str, cell: str) -> None:
    assert hooks._escape(text) == cell


@pytest.mark.parametrize(
    ("docstring", "markdown"),
    [
        ("See :func:`resolve_transport`.", "See `resolve_transport`."),
        ("A :class:`~spark_storm.errors.StormError`", "A `StormError`"),
        ("Its :meth:`.close` and :mod:`spark_storm.codec`", "Its `close` and `spark_storm.codec`"),
        ("Like this::\n\n    code()\n", "Like this:\n\n    code()\n"),
        ("Intro.\n\n::\n\n    tree\n", "Intro.\n\n\n    tree\n"),
    ],
    ids=["func", "tilde", "leading-dot-and-module", "paragraph-colons", "bare-colons"],
)
def test_rest_roles_become_markdown(hooks: ModuleType, docstring: str, markdown: str) -> None:
    assert hooks.markdown_docstring(docstring) == markdown
