"""The one exception tree: every exception class the package defines is in spark_storm.errors and its drawing."""

from __future__ import annotations

import ast
from pathlib import Path

import spark_storm.errors

PKG = Path(__file__).resolve().parents[2] / "spark_storm"


def _exception_classes() -> dict[str, Path]:
    """Every public class whose bases name an Error/Exception class, by file."""
    found: dict[str, Path] = {}
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if any(b.endswith(("Error", "Exception")) for b in bases):
                    found[node.name] = path
    return found


def test_every_exception_class_is_defined_in_errors_and_drawn_in_its_tree() -> None:
    classes = _exception_classes()
    elsewhere = {name: str(path.relative_to(PKG)) for name, path in classes.items() if path.name != "errors.py"}
    assert elsewhere == {}, "define these in spark_storm/errors.py (one exception tree)"
    drawing = spark_storm.errors.__doc__ or ""
    undrawn = sorted(name for name in classes if name not in drawing)
    assert undrawn == [], "add them to the tree at the top of spark_storm/errors.py"
    assert sorted(classes) == sorted(n for n in spark_storm.errors.__all__ if n in classes)
