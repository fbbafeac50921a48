"""MkDocs hook: the figures of ``docs/benchmarks.md``, rendered from the run records in ``bench/results/``.

A benchmark figure lives in exactly one place: a record file, one per run of a bench
(``bench/results/<date>-<name>.yaml``), that says what was measured, when, at which commit, on
which machine, with which command, the figures as the bench printed them, and each target with
whether it was met. The page itself holds only prose and markers: ``<!-- bench: NAME -->`` is
replaced by the record ``bench/results/NAME.yaml`` and ``<!-- bench-index -->`` by a table of
every run. A figure therefore cannot be changed on the page without changing its record, and
the build fails on a record that is malformed, missing from the page, or placed twice.

``tests/docs/test_benchmarks_page.py`` checks every record and that the page renders.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PAGE = "benchmarks.md"

#: Field -> (required, accepted types).  ``commit`` is the tree the figures were measured on,
#: ``recorded_in`` the commit that first published them (often the same).
FIELDS: dict[str, tuple[bool, tuple[type, ...]]] = {
    "title": (True, (str,)),
    "bench": (True, (str,)),
    "command": (True, (str,)),
    "what": (True, (str,)),
    "date": (True, (datetime.date,)),
    "commit": (True, (str,)),
    "recorded_in": (False, (str,)),
    "machine": (True, (str,)),
    "source": (True, (str,)),
    "targets": (True, (list,)),
    "table": (False, (dict,)),
    "figures": (False, (dict,)),
    "notes": (False, (list,)),
}

MARKER = re.compile(r"^<!-- bench: ([\w.-]+) -->[ \t]*$", re.M)
INDEX = "<!-- bench-index -->"
_COMMIT = re.compile(r"^[0-9a-f]{7,40}(~\d+)?$")
_BENCH = re.compile(r"^bench\.(\w+)$")


def load_records(directory: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Every record of ``directory`` by name (the file's stem), in name order (so, by date)."""
    records: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.yaml")):
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            msg = f"bench/results/{path.name} is not valid YAML: {exc}"
            raise ValueError(msg) from exc
        records[path.stem] = data if isinstance(data, dict) else {}
    return records


def problems(name: str, record: Mapping[str, Any], root: Path = ROOT) -> list[str]:
    """List what is wrong with one record (empty when it is whole), each naming the record and the field."""
    out: list[str] = []
    where = f"bench/results/{name}.yaml"
    if not record:
        return [f"{where}: not a mapping of fields"]
    for key, (required, types) in FIELDS.items():
        if key not in record:
            if required:
                out.append(f"{where}: field {key!r} is missing")
        elif not isinstance(record[key], types):
            out.append(f"{where}: field {key!r} must be {' or '.join(t.__name__ for t in types)}")
    out += [f"{where}: unknown field {key!r}" for key in record if key not in FIELDS]
    if out:
        return out
    bench = _BENCH.match(record["bench"])
    if bench is None or not (root / "bench" / f"{bench.group(1)}.py").is_file():
        out.append(f"{where}: bench {record['bench']!r} is not a module under bench/")
    if not record["command"].startswith(f"python -m {record['bench']}"):
        out.append(f"{where}: command {record['command']!r} does not run {record['bench']}")
    for key in ("commit", "recorded_in"):
        if key in record and not _COMMIT.match(record[key]):
            out.append(f"{where}: {key} {record[key]!r} is not a commit id")
    if "table" not in record and "figures" not in record:
        out.append(f"{where}: no figures (give 'table' or 'figures')")
    out += _table_problems(where, record.get("table"))
    for i, target in enumerate(record["targets"]):
        if not isinstance(target, dict) or set(target) != {"target", "measured", "met"}:
            out.append(f"{where}: targets[{i}] must have exactly target, measured and met")
        elif not isinstance(target["met"], bool):
            out.append(f"{where}: targets[{i}].met must be true or false")
    if not all(isinstance(note, str) for note in record.get("notes", [])):
        out.append(f"{where}: notes must be strings")
    return out


def _table_problems(where: str, table: Any) -> list[str]:
    if table is None:
        return []
    header, rows, align = table.get("header"), table.get("rows"), table.get("align")
    if not isinstance(header, list) or not isinstance(rows, list) or not rows:
        return [f"{where}: table needs a header list and at least one row"]
    out = [
        f"{where}: table row {i} has not {len(header)} cells" for i, row in enumerate(rows) if len(row) != len(header)
    ]
    if align is not None and (len(align) != len(header) or not set(align) <= {"l", "r", "c"}):
        out.append(f"{where}: table align must give l, r or c for each of the {len(header)} columns")
    return out


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|")


def render_record(name: str, record: Mapping[str, Any]) -> str:
    """One record as Markdown: heading, command, what it measures, the figures, targets, notes, provenance."""
    out = [f"### {record['title']} {{ #{name} }}", "", f"`{record['command']}`", "", record["what"].strip(), ""]
    table = record.get("table")
    if table:
        rule = {"l": "---", "r": "--:", "c": ":-:"}
        align = table.get("align") or ["l"] * len(table["header"])
        out.append("| " + " | ".join(_cell(h) for h in table["header"]) + " |")
        out.append("|" + "|".join(rule[a] for a in align) + "|")
        out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table["rows"]]
        out.append("")
    if record.get("figures"):
        out += ["| figure | value |", "|---|--:|"]
        out += [f"| {_cell(k)} | {_cell(v)} |" for k, v in record["figures"].items()]
        out.append("")
    if record["targets"]:
        out += ["| target | measured | met |", "|---|---|---|"]
        out += [
            f"| {_cell(t['target'])} | {_cell(t['measured'])} | {'**yes**' if t['met'] else '**no**'} |"
            for t in record["targets"]
        ]
        out.append("")
    out += [f"- {note.strip()}" for note in record.get("notes", [])]
    if record.get("notes"):
        out.append("")
    published = record.get("recorded_in", record["commit"])
    where = "" if published == record["commit"] else f", published in `{published}`"
    out += [
        f"*Run of {record['date']:%Y-%m-%d} at commit `{record['commit']}`{where}; {record['machine']}. "
        f"Source: {record['source']}. Record: `bench/results/{name}.yaml`.*",
        "",
    ]
    return "\n".join(out)


def render_index(records: Mapping[str, Mapping[str, Any]]) -> str:
    """Every run, newest first: date, bench, commit, command, targets met."""
    out = ["| date | run | commit | command | targets met |", "|---|---|---|---|---|"]
    for name, r in sorted(records.items(), key=lambda item: (item[1]["date"], item[0]), reverse=True):
        met = sum(t["met"] for t in r["targets"])
        targets = f"{met} of {len(r['targets'])}" if r["targets"] else "none set"
        out.append(
            f"| {r['date']:%Y-%m-%d} | [{_cell(r['title'])}](#{name}) | `{r['commit']}` | "
            f"`{_cell(r['command'])}` | {targets} |"
        )
    return "\n".join(out) + "\n"


def render_page(markdown: str, records: Mapping[str, Mapping[str, Any]]) -> str:
    """Replace the page's markers with its records; raise ValueError naming what does not fit."""
    errors = [p for name, record in records.items() for p in problems(name, record)]
    placed = MARKER.findall(markdown)
    errors += [f"{PAGE}: no record bench/results/{name}.yaml" for name in placed if name not in records]
    errors += [f"{PAGE}: record {name} is placed twice" for name in set(placed) if placed.count(name) > 1]
    errors += [f"{PAGE}: record bench/results/{name}.yaml is not placed" for name in records if name not in placed]
    if errors:
        raise ValueError("; ".join(errors))
    page = MARKER.sub(lambda m: render_record(m.group(1), records[m.group(1)]), markdown)
    return page.replace(INDEX, render_index(records))


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Render ``benchmarks.md`` from the records (any other page is left as it is)."""
    if page.file.src_uri != PAGE:
        return markdown
    from mkdocs.exceptions import PluginError

    try:
        return render_page(markdown, load_records())
    except ValueError as exc:
        msg = f"benchmark records: {exc}"
        raise PluginError(msg) from exc


def on_serve(server: Any, config: Any, builder: Any) -> Any:
    """``mkdocs serve`` rebuilds when a record changes."""
    server.watch(str(RESULTS))
    return server
