"""docs/benchmarks.md: every figure comes from a run record in bench/results/, and the page renders.

The records are checked by the same code the site's build runs (``docs/bench_hooks.py``), plus
what only a test can check: each record's commit exists in this repository.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from types import ModuleType
from typing import Any

import pytest

from tests.support import ROOT

PAGE = ROOT / "docs" / "benchmarks.md"


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_hooks", ROOT / "docs" / "bench_hooks.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOKS = _hooks()
RECORDS: dict[str, dict[str, Any]] = HOOKS.load_records()


def test_there_are_records() -> None:
    assert RECORDS, "bench/results/ holds no record"


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_a_record_has_every_field_and_runs_a_bench_module_that_exists(name: str) -> None:
    record = RECORDS[name]
    assert HOOKS.problems(name, record) == []
    module = record["bench"].removeprefix("bench.")
    assert (ROOT / "bench" / f"{module}.py").is_file()
    assert record["command"].split()[:3] == ["python", "-m", record["bench"]]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+", name), "name records <date>-<what>.yaml"
    assert name.startswith(f"{record['date']:%Y-%m-%d}"), "the file name starts with the run's date"


def _shallow() -> bool:
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        return True
    out = subprocess.run([git, "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() != "false"


@pytest.mark.skipif(_shallow(), reason="needs git and the repository's full history")
@pytest.mark.parametrize("name", sorted(RECORDS))
def test_a_records_commits_exist(name: str) -> None:
    record = RECORDS[name]
    for key in ("commit", "recorded_in"):
        if key in record:
            out = subprocess.run(
                ["git", "rev-parse", "--verify", "--quiet", f"{record[key]}^{{commit}}"],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            assert out.returncode == 0, f"{name}: {key} {record[key]} is not a commit of this repository"


def test_the_page_renders_every_record_once_and_the_index() -> None:
    page = HOOKS.render_page(PAGE.read_text(encoding="utf-8"), RECORDS)
    assert HOOKS.MARKER.search(page) is None
    assert HOOKS.INDEX not in page
    for name, record in RECORDS.items():
        assert page.count(f"{{ #{name} }}") == 1
        assert f"`{record['command']}`" in page
        assert f"bench/results/{name}.yaml" in page
    assert "| date | run | commit | command | targets met |" in page


def _prose(text: str) -> str:
    """The page's own text: without fenced blocks (examples) and inline code (commands)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`]*`", "", text)


def test_the_page_itself_holds_no_figure() -> None:
    prose = _prose(PAGE.read_text(encoding="utf-8"))
    assert not [line for line in prose.splitlines() if line.lstrip().startswith("|")], "a table outside a record"
    figure = re.compile(r"\d[\d.,]*\s?(%|\u00d7|M\b|k\b|ms\b|µs\b|s\b|min\b|MB\b|GiB\b|KiB\b)")
    found = figure.findall(prose)
    assert not found, f"figures typed into docs/benchmarks.md instead of a record: {found}"


def test_a_bad_record_or_an_unplaced_one_fails_the_render() -> None:
    name, record = next(iter(RECORDS.items()))
    broken = {k: v for k, v in record.items() if k != "machine"}
    with pytest.raises(ValueError, match="field 'machine' is missing"):
        HOOKS.render_page(f"<!-- bench: {name} -->\n", {name: broken})
    with pytest.raises(ValueError, match="is not placed"):
        HOOKS.render_page("no markers\n", {name: record})
    with pytest.raises(ValueError, match="no record"):
        HOOKS.render_page(f"<!-- bench: {name} -->\n<!-- bench: nothing-here -->\n", {name: record})
    wrong_module = {**record, "bench": "bench.nope", "command": "python -m bench.nope"}
    with pytest.raises(ValueError, match="not a module under bench/"):
        HOOKS.render_page(f"<!-- bench: {name} -->\n", {name: wrong_module})
