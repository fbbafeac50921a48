"""Helpers shared by the test tiers (conftests hold only fixtures; test modules import from here)."""

from pathlib import Path

#: The checkout's root (conf/, jobs/, jars/ are found from it; daemons run with it as their cwd).
ROOT = Path(__file__).resolve().parents[2]


def wordcount(tmp: Path, name: str = "wordcount") -> Path:
    """conf/topologies/wordcount.yaml renamed ``name``, its report under ``tmp``."""
    text = (ROOT / "conf" / "topologies" / "wordcount.yaml").read_text()
    text = text.replace('report.dir: "./wordcount-report"', f'report.dir: "{tmp / "report"}"')
    text = text.replace("name: wordcount", f"name: {name}")
    path = tmp / f"{name}.yaml"
    path.write_text(text)
    return path
