"""Cluster-mode values without a ZooKeeper: addresses, names, assignment encoding, slot picking."""

from __future__ import annotations

import pytest

from spark_storm.cluster.nimbus import Nimbus
from spark_storm.cluster.records import Assignment, TopologyRecord, check_topology_name
from spark_storm.cluster.session import ZooKeeperAddress
from spark_storm.errors import ClusterError, ConfigError
from spark_storm.topology import Slot, TopologyBuilder, plan
from spark_storm.topology.model import Input


def _topology(name: str = "t") -> TopologyBuilder:
    return (
        TopologyBuilder(name)
        .source("in", ["word"], parallelism=3, tasks=5)
        .bolt(
            "count",
            "spark_storm.examples.wordcount:CountBolt",
            [Input("in", "fields", fields=("word",))],
            parallelism=2,
        )
    )


@pytest.mark.parametrize(
    ("spec", "hosts", "root"),
    [
        ("127.0.0.1:2181", "127.0.0.1:2181", "/storm"),
        ("zk1:2181,zk2:2182/apps/storm", "zk1:2181,zk2:2182", "/apps/storm"),
        ("zk1,zk2/", "zk1:2181,zk2:2181", ""),
        (None, "127.0.0.1:2181", "/storm"),
    ],
)
def test_zookeeper_address_forms(spec: str | None, hosts: str, root: str) -> None:
    address = ZooKeeperAddress.parse(spec)
    assert (address.hosts, address.root) == (hosts, root)


def test_zookeeper_address_from_conf() -> None:
    conf = {"storm.zookeeper.servers": ["a", "b"], "storm.zookeeper.port": 3000, "storm.zookeeper.root": "/x"}
    assert str(ZooKeeperAddress.parse(None, conf)) == "a:3000,b:3000/x"


@pytest.mark.parametrize("spec", ["127.0.0.1:notaport", ":2181", "h:70000", "h:2181/bad//root", "h:2181/sp ace"])
def test_bad_zookeeper_address_names_the_value_and_the_form(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"HOST:PORT\[,HOST:PORT\]\[/chroot\]|must look like /name"):
        ZooKeeperAddress.parse(spec)


@pytest.mark.parametrize("name", ["", "a/b", "-x", "has space", "x" * 129])
def test_topology_names_that_cannot_be_znodes_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="cannot be used in cluster mode"):
        check_topology_name(name)


def test_assignment_round_trips_and_rebuilds_the_plan() -> None:
    topo = _topology().build()
    p = plan(topo, "h1:6700,h2:6700,h1:6701")
    a = Assignment.from_plan(p, 7, requested=4)
    b = Assignment.from_json(a.to_json(), "/assignments/t")
    assert b == a
    assert b.same_placement(a)
    rebuilt = b.plan(topo)
    assert rebuilt.executor_slot == p.executor_slot
    assert rebuilt.task_slot == p.task_slot
    assert rebuilt.slots == p.slots


def test_an_assignment_places_any_executor_map_not_only_plans() -> None:
    topo = _topology().build()
    p = plan(topo, "h1:1,h2:1")
    moved = {e: Slot("h2", 1) for e in p.executors}  # everything on one worker
    a = Assignment("t", 2, p.slots, moved)
    assert set(a.plan(topo).tasks_of(Slot("h2", 1))) == set(range(1, 8))
    assert a.plan(topo).tasks_of(Slot("h1", 1)) == []


def test_an_assignment_for_another_topology_version_is_refused() -> None:
    a = Assignment.from_plan(plan(_topology().build(), "h:1"), 1)
    other = TopologyBuilder("t").source("in", ["word"], parallelism=1).build()
    with pytest.raises(ClusterError, match="does not match the topology's executors"):
        a.plan(other)
    with pytest.raises(ClusterError, match="cannot place topology"):
        a.plan(_topology("u").build())


def test_malformed_znodes_are_cluster_errors_naming_the_path() -> None:
    with pytest.raises(ClusterError, match="/assignments/t does not hold JSON"):
        Assignment.from_json(b"{nope", "/assignments/t")
    with pytest.raises(ClusterError, match="/assignments/t is not an assignment"):
        Assignment.from_json(b'{"topology": "t"}', "/assignments/t")


def test_topology_record_parses_its_yaml_and_hashes_it() -> None:
    record = TopologyRecord("w", "name: w\ncomponents:\n  - {id: in, source: true, fields: [x]}\n")
    assert record.topology().name == "w"
    assert TopologyRecord.from_json(record.to_json(), "/topologies/w") == record
    assert record.digest != TopologyRecord("w", record.source + "\n").digest


def test_free_slots_are_spread_over_supervisors() -> None:
    live = {Slot("a", 1): "A", Slot("a", 2): "A", Slot("a", 3): "A", Slot("b", 1): "B", Slot("c", 1): "C"}
    picked = Nimbus._pick(sorted(live), 3, [], live)
    assert {live[s] for s in picked} == {"A", "B", "C"}
    # a topology already on A and B gets C first, then A again
    picked = Nimbus._pick([Slot("a", 2), Slot("a", 3), Slot("c", 1)], 2, [Slot("a", 1), Slot("b", 1)], live)
    assert picked == [Slot("c", 1), Slot("a", 2)]
