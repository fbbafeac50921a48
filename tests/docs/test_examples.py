"""Every example of the README and the docs site runs: a broken example fails the suite.

Sybil (chosen over pytest-markdown-docs and mktestdocs because it keeps one namespace per page,
so a guide can build on its earlier blocks, and has hidden set-up blocks and skip directives in
HTML comments that a reader of the rendered page never sees) parses each page:

* every ```python block runs, in order, in the page's namespace; a block that needs Spark or a
  topology gets them from a hidden set-up block calling ``docs`` (tests/support/docs.py), which
  starts the real parts: a local SparkSession, a real local cluster;
* every ```console block is run line by line: ``$ command`` lines run with the project's venv
  first on PATH, from the repository's root, and what follows each one up to the next ``$`` is
  its expected output (``...`` stands for any text), compared with the real output;
* ```bash, ```text and ```yaml blocks are shown, not run (commands that start servers or run
  for minutes; the two README commands run in CI as they are).

One test per page, so a failure names the page and Sybil names the block's line.
"""

from __future__ import annotations

import os
import re
import subprocess
import unittest
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sybil import Example, Sybil
from sybil.parsers.markdown import ClearNamespaceParser, CodeBlockParser, PythonCodeBlockParser, SkipParser

from tests.support import ROOT
from tests.support.docs import PAGES, DocsEnv, needs_spark, stop_spark


def _check_console(example: Example) -> str | None:
    """Run each ``$ command`` of a console block; its output must match the lines below it."""
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    text: str = example.parsed
    steps = re.split(r"^\$ ", text, flags=re.M)[1:]
    for step in steps:
        command, _, expected = step.partition("\n")
        out = subprocess.run(
            ["bash", "-c", command],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        got = (out.stdout + out.stderr).rstrip("\n")
        pattern = ".*".join(re.escape(part) for part in expected.rstrip("\n").split("..."))
        if not re.fullmatch(pattern, got, flags=re.S):
            return f"$ {command}\nexpected:\n{expected}\ngot (exit {out.returncode}):\n{got}\n"
    return None


SYBIL = Sybil(
    parsers=[
        PythonCodeBlockParser(),
        CodeBlockParser(language="console", evaluator=_check_console),
        SkipParser(),
        ClearNamespaceParser(),
    ],
    path=str(ROOT),
)


def _params() -> Iterator[Any]:
    for page in PAGES:
        marks = [pytest.mark.spark] if needs_spark(page) else []
        yield pytest.param(page, marks=marks, id=str(page.relative_to(ROOT)))


@pytest.fixture(scope="module", autouse=True)
def _one_spark_session() -> Iterator[None]:
    yield
    stop_spark()


@pytest.mark.parametrize("page", list(_params()))
def test_every_example_of_the_page_runs(page: Path) -> None:
    document = SYBIL.parse(page)
    env = DocsEnv(page)
    document.namespace["docs"] = env
    try:
        for example in document:
            try:
                example.evaluate()
            except unittest.SkipTest:
                continue  # a block another test runs against its server (checked below); the page goes on
    finally:
        env.close()


def test_every_page_is_collected() -> None:
    # The site's pages and the README: a page added to docs/ runs without registering it.
    assert ROOT / "README.md" in PAGES
    assert len([p for p in PAGES if p.parent.name == "guides"]) >= 10


_SKIP = re.compile(r'^<!-- skip: next "(?P<reason>[^"]*)" -->', re.M)
_RUNS_AS = re.compile(r"^runs as (?P<file>tests/[\w/]+\.py)::(?P<test>test_\w+) \(.+\)$")


def test_a_skipped_example_names_the_test_that_runs_the_same_code() -> None:
    # An example that needs a server the docs tier does not start (a Kafka broker, a Connect
    # server, ZooKeeper for deploy()) says which test runs the same code against the real one.
    for page in PAGES:
        for match in _SKIP.finditer(page.read_text()):
            where = _RUNS_AS.match(match.group("reason"))
            assert where, f"{page.name}: a skip must say 'runs as tests/FILE.py::test_NAME (why)': {match.group(0)}"
            source = (ROOT / where.group("file")).read_text()
            assert f"def {where.group('test')}(" in source, (
                f"{page.name}: no {where.group('test')} in {where.group('file')}"
            )


def test_the_readme_is_a_front_page_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200, "the README is the front page: what it is, the two commands, links"
    commands = re.search(r"```bash\n(?P<body>.*?)```", readme, flags=re.S)
    assert commands is not None
    assert [line.split()[0] for line in commands.group("body").splitlines()] == ["scripts/demo", "scripts/test"]
