"""The writer under changing assignments (cluster mode), without a SparkSession: real workers, real sockets."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from spark_storm.config import load_config
from spark_storm.netutil import free_ports
from spark_storm.spark.options import StormOptions
from spark_storm.spark.writer import POOL, DeliveryError, write_partition
from spark_storm.topology import Slot, load_topology, plan
from spark_storm.worker.worker import Worker
from tests.integration.bolts import read_event_logs
from tests.support import wait_until

pytestmark = pytest.mark.spark


def test_a_retry_on_a_new_assignment_is_not_taken_for_a_replay(tmp_path: Path) -> None:
    """v1 puts task 1 on A and task 2 on B (dead); the retry on v2 puts both on A.

    The retry's rows for A are not v1's rows for A: with per-worker groups under the same
    keys, A would drop task 2's rows as a replay of the group it already processed, and they
    would be lost.  Keyed per task, the retry resends task 1's rows under the key they had
    (A drops them: no row twice, as a stateful topology's ledger needs) and task 2's under a
    key A never saw.
    """
    (tmp_path / "records").mkdir()
    path = tmp_path / "t.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "versions",
                "conf": {"record.dir": str(tmp_path / "records")},
                "components": [
                    {
                        "id": "in",
                        "source": True,
                        "fields": ["key", "n"],
                        "parallelism": 2,
                        "bolt": "tests.integration.bolts:EventLogBolt",
                    }
                ],
            }
        )
    )
    a, b = (Slot("127.0.0.1", p) for p in sorted(free_ports(2)))  # nothing listens on B
    topo = load_topology(str(path))
    assert plan(topo, [a, b]).task_slot == {1: a, 2: b}
    worker = Worker(plan(topo, [a]), a, load_config(None, {"topology.worker.metrics.port": -1}))
    worker.start()
    try:
        wait_until(lambda: worker.active, what="A active")
        base = {"topology": str(path), "delivery": "processed", "queryId": "q", "batchId": "0"}
        v1 = dataclasses.replace(
            StormOptions.parse({**base, "workers": f"{a},{b}", "ackTimeoutMs": "1500"}), assignment_version=1
        )
        v2 = dataclasses.replace(StormOptions.parse({**base, "workers": str(a)}), assignment_version=2)
        rows = pa.record_batch({"key": [f"k{i}" for i in range(40)], "n": list(range(40))})
        with pytest.raises(DeliveryError, match=f"no processed ack from worker {b}"):
            write_partition(v1, [rows])
        first = read_event_logs(tmp_path / "records", "in")
        assert 0 < len(first) < 40  # task 1's rows went through A, task 2's to the dead B
        done = write_partition(v2, [rows])  # the retry, on the assignment without B
        assert done.rows == 40
        assert sorted(read_event_logs(tmp_path / "records", "in").elements()) == list(range(40))  # each once
    finally:
        POOL.close()
        assert worker.stop(30)
