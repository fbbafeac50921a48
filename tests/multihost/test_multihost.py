"""Three hosts (network namespaces), a supervisor on each, nimbus and ZooKeeper beside them, a Spark
stream into the topology at delivery=processed: a host cut off, a rebalance and a nimbus failover
mid-stream, and no event lost.

Each test prints what it measured (time from the cut to the stream flowing again, rows lost and
duplicated); ``pytest -s tests/multihost`` shows it.
"""

from __future__ import annotations

import time

import pytest

from tests.support import wait_until
from tests.support.multihost import POLL, ROWS_PER_FILE, Cluster, recovery, report
from tests.support.netns import HOSTS, Network

pytestmark = [pytest.mark.multihost, pytest.mark.cluster, pytest.mark.spark]


def test_a_host_cut_off_mid_stream_is_replaced_and_no_event_is_lost(cluster: Cluster, network: Network) -> None:
    files = 24  # 8 before the cut, 16 to show the stream flowing again after it
    cluster.start()
    cluster.submit("cut", 3)
    v1 = cluster.running("cut", 3)
    assert {cluster.host_of(s) for s in v1["slots"]} == set(HOSTS)  # one worker per host
    cluster.stream("cut", files)
    cluster.wait_batches(8)
    victim = cluster.host_of(sorted(v1["slots"])[0])
    cut_at = time.time()
    network.cut(victim)
    v2 = cluster.running("cut", 3, timeout=120, newer_than=v1["version"])
    assert v2["version"] > v1["version"]
    assert victim not in {cluster.host_of(s) for s in v2["slots"]}
    done = cluster.finish()
    figures = cluster.events(files * ROWS_PER_FILE)
    flowing, stall = recovery(cluster.batches(), cut_at)
    figures.update(
        reassigned_after_s=round(v2["time"] - cut_at, 2),
        flowing_again_after_s=flowing,
        longest_stall_s=stall,
        batches=done["batches"],
    )
    report("host cut", figures)
    assert figures["lost"] == 0, figures


def test_a_rebalance_from_two_to_three_workers_mid_stream_loses_nothing(cluster: Cluster) -> None:
    files = 20  # 6 before the rebalance, 14 through and after it
    cluster.start()
    cluster.submit("grow", 2)
    v1 = cluster.running("grow", 2)
    cluster.stream("grow", files)
    cluster.wait_batches(6)
    started = time.time()
    cluster.cli("rebalance", "grow", "--workers", "3")
    v2 = cluster.running("grow", 3, timeout=120, newer_than=v1["version"])
    assert v2["version"] > v1["version"]
    assert set(v1["slots"]) < set(v2["slots"])  # the two workers stay, a third joins
    done = cluster.finish()
    figures = cluster.events(files * ROWS_PER_FILE)
    _, stall = recovery(cluster.batches(), started)
    figures.update(
        new_assignment_after_s=round(v2["time"] - started, 2), longest_stall_s=stall, batches=done["batches"]
    )
    report("rebalance 2->3", figures)
    assert figures["lost"] == 0, figures


def test_the_leader_nimbus_killed_the_other_takes_over_and_still_handles_a_cut(
    cluster: Cluster, network: Network
) -> None:
    files = 28  # 5 before the nimbus dies, 8 before the cut, 20 after it
    cluster.start(nimbuses=2)
    cluster.submit("failover", 3)
    v1 = cluster.running("failover", 3)
    cluster.stream("failover", files)
    cluster.wait_batches(5)
    leader = cluster.ask("leader")
    assert leader is not None
    old = next(n for n in cluster.nimbuses if leader.endswith(f":{n.pid}"))
    other = next(n for n in cluster.nimbuses if n is not old)
    killed_at = time.time()
    old.kill()
    wait_until(
        lambda: cluster.ask("leader") == leader.rpartition(":")[0] + f":{other.pid}",
        what="the other nimbus leading",
        timeout=60,
        interval=POLL,
    )
    took_over = round(time.time() - killed_at, 2)
    other.wait_for("is the leader")
    cluster.wait_batches(8)
    victim = cluster.host_of(sorted(v1["slots"])[-1])
    cut_at = time.time()
    network.cut(victim)
    v2 = cluster.running("failover", 3, timeout=120, newer_than=v1["version"])
    assert v2["version"] > v1["version"]
    assert victim not in {cluster.host_of(s) for s in v2["slots"]}
    assert "assigned failover v" in other.output()  # the new leader made it
    done = cluster.finish()
    figures = cluster.events(files * ROWS_PER_FILE)
    flowing, stall = recovery(cluster.batches(), cut_at)
    figures.update(
        nimbus_took_over_after_s=took_over,
        reassigned_after_s=round(v2["time"] - cut_at, 2),
        flowing_again_after_s=flowing,
        longest_stall_s=stall,
        batches=done["batches"],
    )
    report("nimbus failover + host cut", figures)
    assert figures["lost"] == 0, figures
