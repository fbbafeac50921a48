"""MkDocs hooks: the reference pages generated from the code, so they cannot drift from it.

* ``reference/configuration.md``: every key of ``spark_storm/defaults.yaml`` (its section, name,
  default and the comment above it), in the file's order.
* ``reference/cli.md``: every ``spark-storm`` command and flag, from the argparse parsers
  (``spark_storm.cli.parser.build_parser``).

``tests/docs/test_reference.py`` fails when a key has no comment or a flag no help text.

:class:`RestRoles` is a Griffe extension (mkdocs.yml's mkdocstrings options load it from this
file) that turns the reST roles of the package's docstrings into Markdown for the API pages.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import griffe

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = ROOT / "spark_storm" / "defaults.yaml"

_KEY = re.compile(r"^([a-z][\w.\-]*):\s*(.*)$")


@dataclass(frozen=True)
class ConfigKey:
    """One key of defaults.yaml: where it is, its default as written, and what it means."""

    section: str
    name: str
    default: str
    meaning: str


def config_keys(path: Path = DEFAULTS) -> list[ConfigKey]:
    """Read ``defaults.yaml``: each key with the ``### section`` it is under and the comment above it.

    A comment block describes every key that follows it up to the next blank line or comment,
    as the file groups related keys (``group.max.frames`` and ``group.max.bytes``).
    """
    keys: list[ConfigKey] = []
    section, describes = "", False
    comment: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith("###"):
            section, comment, describes = line.lstrip("#").strip(), [], False
        elif line.startswith("#"):
            if describes:
                comment, describes = [], False
            comment.append(line.lstrip("#").strip())
        elif not line.strip():
            comment, describes = [], False
        elif match := _KEY.match(line):
            keys.append(ConfigKey(section, match.group(1), match.group(2).strip(), " ".join(comment).strip()))
            describes = True
    return keys


def _escape(text: str) -> str:
    """Escape text for a Markdown table cell.

    A pipe would end the cell, a bracket start a link, ``<x>`` be taken for an HTML tag; inside a
    `code span` the text stays as written (a backslash would show).
    """
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[i] = parts[i].replace("|", "\\|").replace("[", "\\[").replace("]", "\\]").replace("<", "&lt;")
    return "`".join(parts)


def configuration_page(keys: list[ConfigKey]) -> str:
    """Render the configuration reference as Markdown: one table per section of defaults.yaml."""
    out = [
        "# Configuration keys",
        "",
        "Every key spark-storm reads, generated from `spark_storm/defaults.yaml` (the only place a "
        "default lives) when the site is built. Override a key in a `storm.yaml` (`spark-storm --conf FILE`, "
        "`--set KEY=VALUE`), in a topology file's `conf:`, or in code (`make_context({...})`; on the Spark "
        'side `.option("KEY", value)` for any `storm.*`, `topology.*` or `zmq.*` key, or `.option("conf", FILE)`). '
        "How settings combine: "
        "[Configuration](../guides/configuration.md).",
        "",
        f"{len(keys)} keys.",
    ]
    section = None
    for key in keys:
        if key.section != section:
            section = key.section
            out += ["", f"## {section}", "", "| Key | Default | Meaning |", "|---|---|---|"]
        meaning = _escape(key.meaning)
        default = key.default.replace("|", "\\|")
        out.append(f"| `{key.name}` | `{default}` | {meaning} |")
    return "\n".join(out) + "\n"


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> list[tuple[str, str, argparse.ArgumentParser]]:
    """List (name, help, parser) of every command under ``parser``, each followed by its own commands.

    A nested command is named with its parent's: ``topology plan``.
    """
    found: list[tuple[str, str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                full = f"{prefix}{name}"
                found.append((full, helps.get(name, ""), sub))
                found += _commands(sub, f"{full} ")
    return found


def cli_commands(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """(command, help) for every command, nested ones included (``topology plan``); help may be empty."""
    return [(name, summary) for name, summary, _ in _commands(parser)]


def cli_flags(parser: argparse.ArgumentParser) -> list[tuple[str, str, str]]:
    """(command, flag, help) for every flag and positional of every command; help may be empty."""
    rows = [("", ", ".join(a.option_strings) or a.dest, a.help or "") for a in _own_actions(parser)]
    for name, _, sub in _commands(parser):
        rows += [(name, ", ".join(a.option_strings) or a.dest, a.help or "") for a in _own_actions(sub)]
    return rows


def _own_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction) and a.help != argparse.SUPPRESS
    ]


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if action.default in (None, False, argparse.SUPPRESS) or isinstance(action, argparse._StoreTrueAction):
        return ""
    return f"`{json.dumps(action.default) if not isinstance(action.default, str) else action.default}`"


def _table(actions: list[argparse.Action]) -> list[str]:
    out = ["| Flag | Default | Meaning |", "|---|---|---|"]
    for a in actions:
        flag = ", ".join(f"`{s}`" for s in a.option_strings) or f"`{a.metavar or a.dest}`"
        if a.choices and not isinstance(a.choices, dict):
            flag += " (" + " \\| ".join(str(c) for c in a.choices) + ")"
        meaning = _escape(a.help or "")
        out.append(f"| {flag} | {_default(a)} | {meaning} |")
    return out


def cli_page(parser: argparse.ArgumentParser) -> str:
    """Render the command-line reference as Markdown: each command, its description and its flags."""
    out = [
        "# Command line: `spark-storm`",
        "",
        "Generated from the argparse parsers (`spark_storm/cli/parser.py`) when the site is built; "
        "`spark-storm COMMAND --help` prints the same.",
        "",
        "## Global flags",
        "",
        *_table(_own_actions(parser)),
    ]
    for name, summary, sub in _commands(parser):
        out += ["", f"## `{name}`", "", summary[:1].upper() + summary[1:] + ("" if summary.endswith(".") else ".")]
        if sub.description:
            out += ["", sub.description]
        out += ["", "```text", _usage(sub), "```", ""]
        actions = _own_actions(sub)
        nested = [f"`{child}`" for child, _, _ in _commands(sub, f"{name} ")]
        if actions:
            out += _table(actions)
        elif nested:
            out.append("Commands: " + ", ".join(nested) + ".")
        else:
            out.append("No flags.")
    return "\n".join(out) + "\n"


def _usage(parser: argparse.ArgumentParser) -> str:
    """Format the usage line as ``--help`` prints it, at 70 columns (the page's text) whatever the terminal's."""
    formatter = argparse.HelpFormatter(parser.prog, width=70)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def on_files(files: Any, config: Any) -> Any:
    """Add the generated reference pages to the site (MkDocs >= 1.6: ``File.generated``)."""
    from mkdocs.structure.files import File

    from spark_storm.cli.parser import build_parser

    files.append(File.generated(config, "reference/configuration.md", content=configuration_page(config_keys())))
    files.append(File.generated(config, "reference/cli.md", content=cli_page(build_parser())))
    return files


_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj):`(~?)\.?([^`]+)`")


def markdown_docstring(text: str) -> str:
    """Turn the reST a docstring here uses into Markdown for mkdocstrings.

    ``:class:`~pkg.mod.Name``` becomes ```Name``` (``~``: the last part only, as Sphinx shows it),
    ``:func:`pkg.f``` becomes ```pkg.f```; a paragraph ending in ``::`` loses one colon (a line of
    only ``::`` goes), leaving the indented block after it a Markdown code block.
    """
    text = _ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text)
    lines = []
    for line in text.split("\n"):
        if line.strip() == "::":
            continue
        lines.append(line[:-1] if line.endswith("::") else line)
    return "\n".join(lines)


class RestRoles(griffe.Extension):
    """Griffe extension: every docstring through :func:`markdown_docstring` as the package loads."""

    def on_instance(self, *, node: Any, obj: griffe.Object, agent: Any, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring, if it has one."""
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
