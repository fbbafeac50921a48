"""Layers import only downward; heavy optional packages load only when chosen."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import spark_storm.errors
import spark_storm.messaging
import spark_storm.messaging.wire
import spark_storm.ui

PKG = Path(__file__).resolve().parents[2] / "spark_storm"
ORDER = [
    "messaging",
    "multilang",
    "codec",
    "state",
    "topology",
    "transport",
    "cluster",
    "worker",
    "shell",
    "ui",
    "spark",
    "demos",
]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


@pytest.mark.parametrize("layer", ORDER)
def test_layers_import_only_downward(layer: str) -> None:
    higher = ORDER[ORDER.index(layer) + 1 :]
    for path in (PKG / layer).rglob("*.py") if (PKG / layer).exists() else []:
        for name in _imports(path):
            for h in higher:
                assert not name.startswith(f"spark_storm.{h}"), f"{path} imports {name}"
            if ORDER.index(layer) < ORDER.index("spark"):  # the library under spark; the demos above it are apps
                assert not name.startswith("pyspark"), f"{path} imports pyspark"


def test_transport_and_messaging_never_import_pyspark_or_zmq_unasked() -> None:
    code = (
        "import sys, spark_storm.transport, spark_storm.transport.tcp, spark_storm.transport.local;"
        "assert 'pyspark' not in sys.modules; assert 'zmq' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "module", [spark_storm.messaging, spark_storm.errors, spark_storm.messaging.wire, spark_storm.ui]
)
def test_public_names_are_sorted_and_exist(module: object) -> None:
    names = module.__all__  # type: ignore[attr-defined]
    # isort style (ruff RUF022): CONSTANTS, then Classes, then functions, each alphabetical
    assert names == sorted(names, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n))
    for name in names:
        assert hasattr(module, name)


@pytest.mark.parametrize("module", ["latency.py", "http_policy.py", "netutil.py"])
def test_shared_bottom_modules_import_nothing_from_the_package(module: str) -> None:
    # the worker, the UI and the exporters all stand on them
    assert not {n for n in _imports(PKG / module) if n.startswith("spark_storm")}
