"""The layout of the test suite itself: shared helpers live in tests/support, nowhere else.

Two rules, checked on the source (``ast``) of every module under tests/:

- no module imports a conftest or a test module (``test_*.py``): what two modules share
  lives in tests/support (or another helper module), so a test module can move, be renamed
  or be deselected without breaking another;
- a conftest holds only fixtures, pytest hooks (``pytest_*``), pytest's own conftest
  variables (``pytest_plugins``, ``collect_ignore``...), imports and private (``_``) names
  for its own use; any other function, class or constant is a helper and belongs in
  tests/support.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import ROOT

#: Names pytest itself reads from a conftest.
CONFTEST_VARIABLES = frozenset({"pytest_plugins", "collect_ignore", "collect_ignore_glob"})


def _module_file(root: Path, module: str) -> Path | None:
    """The file of ``module`` (dotted) under ``root``, or None when it is not one of ours."""
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _is_test_or_conftest(path: Path) -> bool:
    return path.name == "conftest.py" or (path.name.startswith("test_") and path.suffix == ".py")


def _imported_modules(node: ast.Import | ast.ImportFrom, path: Path, root: Path) -> list[str]:
    """Every module of ours that ``node`` (in ``path``) imports, dotted."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        package = path.relative_to(root).parent.parts
        package = package[: len(package) - (node.level - 1)]
        base = ".".join((*package, node.module) if node.module else package)
    else:
        base = node.module or ""
    # ``from pkg import name`` imports the module pkg.name when there is one
    return [base] + [f"{base}.{alias.name}" for alias in node.names if _module_file(root, f"{base}.{alias.name}")]


def _is_fixture(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(target, ast.Attribute) and target.attr == "fixture") or (
        isinstance(target, ast.Name) and target.id == "fixture"
    )


def _conftest_statement_problem(stmt: ast.stmt) -> str | None:
    """Why ``stmt`` (top level of a conftest) does not belong there, or None when it does."""
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return None
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
        return None  # the docstring
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
        if stmt.name.startswith(("_", "pytest_")) or any(_is_fixture(d) for d in stmt.decorator_list):
            return None
        return f"{stmt.name}() is neither a fixture nor a pytest_* hook"
    if isinstance(stmt, ast.ClassDef):
        return None if stmt.name.startswith("_") else f"class {stmt.name} is public"
    if isinstance(stmt, ast.Assign | ast.AnnAssign):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        public = [n for n in names if not n.startswith("_") and n not in CONFTEST_VARIABLES]
        return f"{', '.join(public)} is a public module-level name" if public or not names else None
    return f"a top-level {type(stmt).__name__} statement"


def layout_violations(root: Path, package: str = "tests") -> list[str]:
    """Every break of the two rules in ``root/package``, as ``path:line: what``."""
    found = []
    for path in sorted((root / package).rglob("*.py")):
        where = path.relative_to(root)
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for module in _imported_modules(node, path, root):
                target = _module_file(root, module)
                if target is not None and target != path and _is_test_or_conftest(target):
                    kind = "a conftest" if target.name == "conftest.py" else "a test module"
                    found.append(
                        f"{where}:{node.lineno}: imports {module} ({kind}); shared helpers go in tests/support"
                    )
        if path.name == "conftest.py":
            for stmt in tree.body:
                problem = _conftest_statement_problem(stmt)
                if problem:
                    found.append(
                        f"{where}:{stmt.lineno}: {problem}; a conftest holds only fixtures, hooks "
                        "and private (_) names, helpers go in tests/support"
                    )
    return found


def test_no_module_imports_a_conftest_or_a_test_module_and_conftests_hold_only_fixtures() -> None:
    violations = layout_violations(ROOT)
    assert not violations, "\n".join(violations)


def _tree(root: Path, files: dict[str, str]) -> Path:
    """A ``tests`` package under ``root`` with one tier (and its empty conftest), and ``files``."""
    for name, text in {
        "tests/__init__.py": "",
        "tests/tier/__init__.py": "",
        "tests/tier/conftest.py": "",
        **files,
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


GOOD_CONFTEST = '''"""Fixtures."""
from __future__ import annotations

import pytest
from pytest import fixture

from tests.support import ROOT

pytest_plugins = ["pytester"]
_CACHE: dict[str, int] = {}


def _helper() -> int:
    return 1


class _Private:
    pass


@pytest.fixture
def plain() -> int:
    return _helper()


@pytest.fixture(scope="module")
def called() -> int:
    return 2


@fixture
async def bare() -> int:
    return 3


def pytest_configure(config: pytest.Config) -> None:
    pass
'''


def test_the_check_passes_fixtures_hooks_private_names_and_helper_imports(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "tests/tier/conftest.py": GOOD_CONFTEST,
            "tests/tier/helpers.py": "X = 1\n",
            "tests/tier/test_a.py": "from tests.tier.helpers import X\nfrom . import helpers\nimport tests.tier.helpers\n",
        },
    )
    assert layout_violations(root) == []


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (
            {"tests/tier/test_a.py": "import os\nfrom tests.tier.conftest import helper\n"},
            "tests/tier/test_a.py:2: imports tests.tier.conftest (a conftest)",
        ),
        (
            {"tests/tier/test_a.py": "from .conftest import helper\n"},
            "tests/tier/test_a.py:1: imports tests.tier.conftest (a conftest)",
        ),
        (
            {"tests/tier/test_a.py": "def f():\n    from tests.tier import conftest\n"},
            "tests/tier/test_a.py:2: imports tests.tier.conftest (a conftest)",
        ),
        (
            {"tests/tier/test_a.py": "from tests.tier.test_b import Helper\n", "tests/tier/test_b.py": ""},
            "tests/tier/test_a.py:1: imports tests.tier.test_b (a test module)",
        ),
        (
            {"tests/other.py": "import tests.tier.test_b\n", "tests/tier/test_b.py": ""},
            "tests/other.py:1: imports tests.tier.test_b (a test module)",
        ),
        (
            {"tests/tier/conftest.py": "import pytest\n\ndef helper():\n    pass\n"},
            "tests/tier/conftest.py:3: helper() is neither a fixture nor a pytest_* hook;",
        ),
        (
            {"tests/tier/conftest.py": "class Daemon:\n    pass\n"},
            "tests/tier/conftest.py:1: class Daemon is public;",
        ),
        (
            {"tests/tier/conftest.py": '"""Doc."""\nFAST: dict = {}\n'},
            "tests/tier/conftest.py:2: FAST is a public module-level name;",
        ),
        (
            {"tests/tier/conftest.py": "import logging\nlogging.basicConfig()\n"},
            "tests/tier/conftest.py:2: a top-level Expr statement;",
        ),
    ],
    ids=[
        "from-conftest",
        "relative-from-conftest",
        "conftest-as-a-name-inside-a-function",
        "from-another-test-module",
        "a-helper-importing-a-test-module",
        "a-helper-function-in-a-conftest",
        "a-class-in-a-conftest",
        "a-constant-in-a-conftest",
        "a-statement-in-a-conftest",
    ],
)
def test_the_check_names_the_file_and_line_of_each_break(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    violations = layout_violations(_tree(tmp_path, files))
    assert len(violations) == 1, violations
    assert violations[0].startswith(expected), violations
