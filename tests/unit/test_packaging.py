"""pyproject's ranges, the floor set and the newest tested set agree; extras name what they install."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from spark_storm.errors import MissingExtraError
from spark_storm.extras import EXTRAS, extra_for, missing_extra

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins(name: str) -> dict[str, Version]:
    out = {}
    for line in (ROOT / "constraints" / name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            out[req.name.lower().replace("_", "-")] = Version(next(iter(req.specifier)).version)
    return out


def _runtime_requirements() -> list[Requirement]:
    extras = PYPROJECT["optional-dependencies"]
    reqs = [Requirement(r) for r in PYPROJECT["dependencies"]]
    reqs += [Requirement(r) for extra in ("zmq", "kafka", "cluster", "spark", "connect") for r in extras[extra]]
    return reqs


def test_every_runtime_dependency_is_a_range_with_a_floor() -> None:
    for req in _runtime_requirements():
        operators = {s.operator for s in req.specifier}
        assert ">=" in operators, f"{req}: no floor"
        assert "==" not in operators, f"{req}: pinned; a runtime's own version must be able to stay"


def test_the_floor_set_pins_each_declared_floor_and_the_newest_set_fits_every_range() -> None:
    floor, latest = _pins("floor.txt"), _pins("latest.txt")
    for req in _runtime_requirements():
        name = req.name.lower()
        declared = next(Version(s.version) for s in req.specifier if s.operator == ">=")
        assert name in floor, f"constraints/floor.txt lacks {name} (floor {declared})"
        pin = floor[name]
        assert pin in req.specifier, f"floor pin {name}=={pin} is outside {req}"
        assert pin.release[: len(declared.release)] == declared.release, f"{name}=={pin} is not the floor {declared}"
        assert latest[name] in req.specifier, f"newest tested {name}=={latest[name]} is outside {req}"
    assert floor["numpy"] == Version("1.26.4")
    assert floor["pyarrow"] == Version("18.1.0")


def test_requires_python_matches_the_interpreter_and_the_classifiers() -> None:
    assert PYPROJECT["requires-python"] == ">=3.11"
    assert sys.version_info >= (3, 11)
    versions = [c.rsplit(" ", 1)[1] for c in PYPROJECT["classifiers"] if c.count("::") == 2 and "3." in c]
    assert versions == ["3.11", "3.12", "3.13"]


def test_each_optional_module_names_its_extra_in_one_line() -> None:
    extras = PYPROJECT["optional-dependencies"]
    for module, (extra, _) in EXTRAS.items():
        assert extra in extras, f"{module}: no extra {extra!r} in pyproject.toml"
        assert extra_for(f"{module}.sub") == extra
    assert extra_for("json") is None
    exc = ModuleNotFoundError("No module named 'kazoo'", name="kazoo")
    error = missing_extra(exc, "spark-storm nimbus")
    assert isinstance(error, MissingExtraError)
    assert isinstance(error, ImportError)
    assert str(error) == "spark-storm nimbus needs 'kazoo', which is not installed: pip install 'spark-storm[cluster]'"
    assert missing_extra(ModuleNotFoundError("x", name="json")) is None


def test_format_storm_imports_without_the_cluster_extra_and_deploy_names_it() -> None:
    # Spark's Python workers import pyspark_storm with only the `spark` extra installed; deploy()
    # needs kazoo and says so in one line when it is used.
    code = (
        "import sys\n"
        "sys.modules['kazoo'] = None\n"
        "import pyspark_storm, pyspark_storm_state, spark_storm.spark as s\n"
        "assert 'spark_storm.cluster.state' not in sys.modules\n"
        "try:\n"
        "    s.deploy\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "MissingExtraError spark_storm.spark.deploy() needs 'kazoo', which is not installed: "
        "pip install 'spark-storm[cluster]'"
    )
