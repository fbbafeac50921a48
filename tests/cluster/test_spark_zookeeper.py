"""option("zookeeper", ...): Spark writes into a topology submitted to the cluster, following its assignment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_storm.cluster.records import ACTIVE, KILLED, TopologyRecord
from spark_storm.cluster.state import ClusterState
from spark_storm.errors import ClusterError, ConfigError, UnknownTopologyError
from tests.integration.bolts import read_event_logs
from tests.support import wait_until
from tests.support.cluster import FAST, Daemons, cli, health, ports, running_workers, send_heartbeat, sets, submit
from tests.support.spark import write_json_rows

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.usefixtures("driver_sessions")]

BOLT = "tests.integration.bolts:EventLogBolt"


def topology(tmp: Path, name: str, sources: int = 3) -> Path:
    """``in`` (a source, ``sources`` executors) -> ``out``; both log every event id they see."""
    (tmp / "records").mkdir(exist_ok=True)
    topo = {
        "name": name,
        # exact counts: no tree may time out on a loaded machine (the cluster tests' default is 1 s)
        "conf": {"record.dir": str(tmp / "records"), "topology.message.timeout.secs": 30},
        "components": [
            {"id": "in", "source": True, "fields": ["key", "n"], "parallelism": sources, "bolt": BOLT},
            {"id": "out", "bolt": BOLT, "parallelism": 2, "inputs": [{"from": "in", "grouping": "shuffle"}]},
        ],
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(topo))
    return path


def _rows(start: int, n: int) -> list[dict[str, Any]]:
    return [{"key": f"k{i % 23}", "n": i} for i in range(start, start + n)]


def _spark_groups_by_slot(state: ClusterState, name: str) -> dict[str, int]:
    """Delivery groups each worker got straight from Spark writers (forwarded tuples are not groups)."""
    out = {}
    for slot in state.read_heartbeats(name):
        out[str(slot)] = sum(int(q["groups"]) for q in health(state, name, slot)["writers"])
    return out


def test_one_stream_follows_a_rebalance_between_its_micro_batches(
    spark: Any, daemons: Daemons, state: ClusterState, zk: str, tmp_path: Path
) -> None:
    daemons.nimbus()
    daemons.supervisor(ports(3)).wait_for("offering")
    submit(zk, topology(tmp_path, "zkstream"), 1)
    running_workers(daemons, state, "zkstream", 1)
    src = tmp_path / "src"
    src.mkdir()
    records = tmp_path / "records"
    q = (
        spark.readStream.schema("key string, n long")
        .option("maxFilesPerTrigger", 1)
        .json(str(src))
        .writeStream.format("storm")
        .option("zookeeper", zk)
        .option("topology", "zkstream")
        .option("delivery", "processed")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        write_json_rows(src, _rows(0, 600), files=3, prefix="a")
        wait_until(lambda: len(read_event_logs(records, "out")) == 600, what="the first 600 events", timeout=120)
        before = _spark_groups_by_slot(state, "zkstream")
        # rebalance to 3 workers while the query runs: its next micro-batches go where v2 says
        assert cli("rebalance", "zkstream", "--workers", "3", "--zookeeper", zk, *sets(FAST)).returncode == 0
        running_workers(daemons, state, "zkstream", 3)
        v2 = state.read_assignment("zkstream")
        assert v2 is not None
        assert v2.version == 2
        wait_until(
            lambda: all(hb.record.get("assignment_version") == 2 for hb in state.read_heartbeats("zkstream").values()),
            what="every worker on v2",
            timeout=30,
        )
        write_json_rows(src, _rows(600, 900), files=3, prefix="b")
        wait_until(lambda: len(read_event_logs(records, "out")) == 1500, what="all 1500 events", timeout=120)
        assert q.exception() is None, q.exception()
    finally:
        q.stop()
    after = _spark_groups_by_slot(state, "zkstream")
    fed = {s for s, n in after.items() if n > before.get(s, 0)}
    assert fed == {str(s) for s in v2.slots}  # each of the 3 workers runs an 'in' executor: Spark sent to each
    assert sorted(read_event_logs(records, "out").elements()) == list(range(1500))


def test_foreach_batch_and_batch_writes_take_the_zookeeper_option(
    spark: Any, daemons: Daemons, state: ClusterState, zk: str, tmp_path: Path
) -> None:
    from spark_storm.spark import storm_sink

    daemons.nimbus()
    daemons.supervisor(ports(2)).wait_for("offering")
    path = topology(tmp_path, "zkbatch", sources=2)
    submit(zk, path, 2)
    running_workers(daemons, state, "zkbatch", 2)
    df = spark.createDataFrame(_rows(0, 300))
    # batch write, the topology named by its YAML (its name is used; the submitted definition counts)
    df.write.format("storm").option("zookeeper", zk).option("topology", str(path)).option("delivery", "processed").mode(
        "append"
    ).save()
    src = tmp_path / "src"
    write_json_rows(src, _rows(300, 400), files=2)
    q = (
        spark.readStream.schema("key string, n long")
        .json(str(src))
        .writeStream.foreachBatch(storm_sink(topology="zkbatch", zookeeper=zk, delivery="processed"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    assert sorted(read_event_logs(tmp_path / "records", "out").elements()) == list(range(700))


def test_zookeeper_option_errors_name_the_problem_on_the_driver(state: ClusterState, zk: str, tmp_path: Path) -> None:
    from spark_storm.spark.options import StormOptions

    with pytest.raises(ConfigError, match=r"option 'zookeeper'='nohost:port': ZooKeeper address"):
        StormOptions.parse({"topology": "t", "zookeeper": "nohost:port"})
    with pytest.raises(ConfigError, match="options 'zookeeper' and 'workers' exclude each other"):
        StormOptions.parse({"topology": "t", "zookeeper": zk, "workers": "127.0.0.1:6700"})
    with pytest.raises(UnknownTopologyError, match=f"no topology 'nope' in ZooKeeper {zk}"):
        StormOptions.parse({"topology": "nope", "zookeeper": zk})
    source = yaml.safe_load(topology(tmp_path, "waiting").read_text())
    state.submit_topology(TopologyRecord("waiting", yaml.safe_dump(source), ACTIVE, 1))
    with pytest.raises(ClusterError, match=r"'waiting' has no assignment in ZooKeeper .* is a nimbus running"):
        StormOptions.parse({"topology": "waiting", "zookeeper": zk, "storm.zookeeper.connection.timeout": "300"})
    state.set_status("waiting", KILLED, kill_at=0.0)
    with pytest.raises(ClusterError, match=r"'waiting' in ZooKeeper .* is killed"):
        StormOptions.parse({"topology": "waiting", "zookeeper": zk})


def test_the_driver_waits_until_every_worker_runs_a_new_assignment(
    state: ClusterState, zk: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows sent before a worker's peers follow a new version would lose their trees' acks: wait, bounded."""
    from spark_storm.cluster.records import Assignment
    from spark_storm.spark.options import StormOptions
    from spark_storm.topology import Slot, plan

    source = yaml.safe_load(topology(tmp_path, "settle").read_text())
    state.submit_topology(TopologyRecord("settle", yaml.safe_dump(source), ACTIVE, 2))
    a, b = Slot("127.0.0.1", 6700), Slot("127.0.0.1", 6701)
    topo = state.read_topology("settle").topology()
    state.write_assignment(Assignment.from_plan(plan(topo, [a, b]), 3))
    send_heartbeat(state, "settle", a, assignment_version=3)
    send_heartbeat(state, "settle", b, assignment_version=2)  # b still runs v2
    options = {"topology": "settle", "zookeeper": zk, "assignmentWaitMs": "300"}
    with caplog.at_level("WARNING", logger="spark_storm.spark.assignments"):
        parsed = StormOptions.parse(options)
    assert parsed.assignment_version == 3
    assert "assignment v3 of settle: workers 127.0.0.1:6701 do not run it after 0.3s; sending anyway" in caplog.text
    caplog.clear()
    send_heartbeat(state, "settle", b, assignment_version=3)
    with caplog.at_level("WARNING", logger="spark_storm.spark.assignments"):
        assert StormOptions.parse({**options, "assignmentWaitMs": "60000"}).assignment_version == 3
    assert "do not run it" not in caplog.text
