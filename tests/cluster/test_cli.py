"""The cluster commands as a user runs them: output, and one clear line per mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_storm.netutil import free_ports
from tests.support import wait_until, wordcount
from tests.support.cluster import FAST, Daemons, cli, sets

pytestmark = pytest.mark.cluster


def _zk_cli(zk: str, *args: str) -> tuple[int, str, str]:
    out = cli(*args, "--zookeeper", zk, *sets(FAST))
    return out.returncode, out.stdout, out.stderr


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("spark-storm: ")]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_zookeeper_start_status_stop(zookeeper_jars: Path, tmp_path: Path) -> None:
    state = str(tmp_path / "zk")
    started = cli("zookeeper", "start", "--dir", state)
    assert started.returncode == 0, started.stderr
    assert "zookeeper serving on 127.0.0.1:" in started.stdout
    status = cli("zookeeper", "status", "--dir", state)
    assert status.returncode == 0
    assert "zookeeper running: pid" in status.stdout
    assert "zookeeper stopped" in cli("zookeeper", "stop", "--dir", state).stdout
    assert cli("zookeeper", "status", "--dir", state).returncode == 1


def test_submit_list_and_the_lifecycle_commands(daemons: Daemons, zk: str, tmp_path: Path) -> None:
    daemons.nimbus().wait_for("is the leader")
    path = wordcount(tmp_path)
    code, out, err = _zk_cli(zk, "submit", str(path), "--workers", "2")
    assert code == 0, err
    assert "submitted topology wordcount (2 workers)" in out
    code, out, _ = _zk_cli(zk, "list")
    assert "nimbus leader: " in out
    assert "none" not in out.splitlines()[0]
    row = next(line for line in out.splitlines() if line.startswith("wordcount"))
    assert row.split()[1:3] == ["active", "0/2"]  # no supervisor yet: nothing assigned
    assert _zk_cli(zk, "deactivate", "wordcount")[1].strip() == "topology wordcount is inactive"
    assert _zk_cli(zk, "activate", "wordcount")[1].strip() == "topology wordcount is active"
    assert "rebalancing to 3 workers" in _zk_cli(zk, "rebalance", "wordcount", "--workers", "3")[1]
    assert "killed" in _zk_cli(zk, "kill", "wordcount", "--wait", "0")[1]
    wait_until(lambda: "no topologies submitted" in _zk_cli(zk, "list")[1], what="the topology removed")


def test_no_nimbus_is_a_clear_error(zk: str, tmp_path: Path) -> None:
    code, _, err = _zk_cli(zk, "submit", str(wordcount(tmp_path)))
    assert code == 2
    line = _one_error_line(err)
    assert f"no nimbus is running for ZooKeeper {zk}" in line
    assert f"spark-storm nimbus --zookeeper {zk}" in line
    assert "no topologies submitted" in _zk_cli(zk, "list")[1]  # nothing was written


def test_a_taken_name_an_unknown_name_and_bad_values_are_clear_errors(
    daemons: Daemons, zk: str, tmp_path: Path
) -> None:
    daemons.nimbus().wait_for("is the leader")
    path = wordcount(tmp_path)
    assert _zk_cli(zk, "submit", str(path))[0] == 0
    code, _, err = _zk_cli(zk, "submit", str(path))
    assert code == 2
    assert "topology 'wordcount' is already submitted (active): kill it first (`spark-storm kill wordcount`)" in (
        _one_error_line(err)
    )
    for command in (["activate", "wordcont"], ["kill", "wordcont"], ["rebalance", "wordcont", "--workers", "2"]):
        code, _, err = _zk_cli(zk, *command)
        assert code == 2
        assert "no topology 'wordcont'" in _one_error_line(err)
        assert "submitted: wordcount" in err
    code, _, err = _zk_cli(zk, "rebalance", "wordcount", "--workers", "0")
    assert "at least 1 worker, got 0" in _one_error_line(err)
    typo = tmp_path / "typo.yaml"
    typo.write_text(path.read_text().replace("name: wordcount", "name: typo").replace("SplitBolt", "SplitBlot"))
    code, _, err = _zk_cli(zk, "submit", str(typo))
    assert code == 2
    assert "has no 'SplitBlot'; did you mean spark_storm.examples.wordcount:SplitBolt?" in _one_error_line(err)
    bad_name = tmp_path / "bad.yaml"
    bad_name.write_text(path.read_text().replace("name: wordcount", "name: 'my topology'"))
    assert "cannot be used in cluster mode" in _one_error_line(_zk_cli(zk, "submit", str(bad_name))[2])


def test_zookeeper_not_running_or_badly_named(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    out = cli("list", "--zookeeper", f"127.0.0.1:{port}", "--set", "storm.zookeeper.connection.timeout=1000")
    assert out.returncode == 2
    line = _one_error_line(out.stderr)
    assert f"cannot connect to ZooKeeper at 127.0.0.1:{port} within 1s" in line
    assert "spark-storm zookeeper start" in line
    out = cli("list", "--zookeeper", "127.0.0.1:21x81")
    assert "ZooKeeper address '127.0.0.1:21x81' is not HOST:PORT" in _one_error_line(out.stderr)
