"""deploy() from a Spark Connect client (pyspark's own local Connect server, ``local[2,4]``).

A Connect client has no SparkContext, but it can run the background job deploy() needs: the
DataFrame API (``mapInArrow``) in a thread of its own, tagged with ``addTag`` and cancelled
with ``interruptTag``.  Nimbus runs in the client; ZooKeeper too, when the server is on this
machine (where its executors can reach the client).  A remote server cannot: that is our error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spark_storm.errors import DeployError
from spark_storm.spark import deploy, is_connect
from tests.support import wordcount
from tests.support.on_spark import FAST_DEPLOY, accepted, processes, wait_all_gone
from tests.support.spark import write_json_rows

pytestmark = [pytest.mark.connect, pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(900)]


def test_deploy_over_spark_connect_feeds_and_stops_leaving_nothing(connect: Any, tmp_path: Path) -> None:
    assert is_connect(connect)
    rows = [{"sentence": f"jumps over the lazy dog {i % 31}"} for i in range(1200)]
    write_json_rows(tmp_path / "src", rows, files=3)
    with deploy(connect, str(wordcount(tmp_path, "wcconnect")), workers=1, conf=FAST_DEPLOY) as topo:
        assert topo.status().state == "running"
        procs = processes(topo)
        q = (
            connect.readStream.schema("sentence string")
            .option("maxFilesPerTrigger", 1)
            .json(str(tmp_path / "src"))
            .writeStream.format("storm")
            .option("topology", topo.name)
            .option("zookeeper", topo.zookeeper)
            .option("delivery", "processed")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()
        assert accepted(topo) == len(rows)
    assert topo.state == "stopped"
    wait_all_gone(procs, "after stop() over Connect")


def test_deploy_over_a_remote_connect_server_needs_a_zookeeper_of_yours(
    connect: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that is not on the cluster's network cannot host ZooKeeper for its executors."""
    monkeypatch.setattr(connect.client._builder, "_host", "spark-connect.example.com")
    msg = (
        r"^deploy\(\) over Spark Connect \(server spark-connect.example.com, master local\[2,4\]\) cannot start "
        r"ZooKeeper for you: this client is not on the cluster's network, so its executors could not reach a server "
        r"here. Give deploy\(zookeeper='host:port'\) a ZooKeeper that this client and every executor reach$"
    )
    with pytest.raises(DeployError, match=msg):
        deploy(connect, str(wordcount(tmp_path, "wcremote")), workers=1, conf=FAST_DEPLOY)
