"""Batch bolts in real worker processes: columnar wordcount, mixing with tuple bolts, acks, ticks."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import pytest

from spark_storm.messaging import TaskMessage
from spark_storm.messaging.wire import FAILED, PROCESSED, BatchHeader
from spark_storm.topology import Slot
from spark_storm.topology.loader import load_topology
from tests.integration.runs import Run, arrow_payload
from tests.support import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BATCH = "tests.integration.bolts:BatchRecordingBolt"
TUPLE = "tests.integration.bolts:RecordingBolt"
PASS_BATCH = "spark_storm.worker.bolt:PassThroughBatchBolt"


def _send_arrow(run: Run, rows: list[list[Any]], names: list[str], per_message: int = 50) -> None:
    """Arrow payloads (as the Spark writer sends them) spread over the source tasks."""
    sources = list(run.plan.component_tasks["in"])
    by_slot: dict[Slot, list[TaskMessage]] = {}
    for i, start in enumerate(range(0, len(rows), per_message)):
        task = sources[i % len(sources)]
        payload = arrow_payload(rows[start : start + per_message], names)
        by_slot.setdefault(run.plan.task_slot[task], []).append(TaskMessage(task, payload))
    for slot, msgs in by_slot.items():
        run.conns[slot].send(msgs)
    for conn in run.conns.values():
        assert conn.flush(30)


def _arrow_wordcount(tmp: Path, report: str = "report") -> dict[str, Any]:
    """conf/topologies/wordcount-arrow.yaml with its source named "in" (what Run feeds), state and report in tmp."""
    import yaml

    spec: dict[str, Any] = yaml.safe_load((ROOT / "conf" / "topologies" / "wordcount-arrow.yaml").read_text())
    spec["name"] = "in-wordcount"
    # count keeps checkpointed state: in this test's own dir, not the host's shared default (other runs' counts)
    spec.setdefault("conf", {})["topology.state.provider.config"] = {"dir": str(tmp / "state")}
    for comp in spec["components"]:
        if comp["id"] == "sentences":
            comp["id"] = "in"
        for inp in comp.get("inputs", []):
            if inp["from"] == "sentences":
                inp["from"] = "in"
        if comp["id"] == "report":
            comp["conf"]["report.dir"] = str(tmp / report)
    return spec


def _sentences(n: int) -> tuple[list[list[Any]], Counter[str]]:
    corpus = (ROOT / "spark_storm" / "examples" / "corpus.txt").read_text().splitlines()
    sentences = [[corpus[i % len(corpus)] + f" n{i % 7}"] for i in range(n)]
    return sentences, Counter(w for (s,) in sentences for w in re.findall(r"[\w']+", s.lower()))


def _counted(run: Run) -> int:
    return sum(
        t["executed"]
        for s in run.cluster.slots
        for e in run.health(s)["executors"].values()
        if e["component"] == "count"
        for t in e["tasks"].values()
    )


def _final_counts(report: Path) -> Counter[str]:
    final: Counter[str] = Counter()
    for path in report.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            final.update(json.loads(line)["final"])
    return final


def test_columnar_wordcount_counts_exactly_over_two_workers(tmp: Path) -> None:
    topo = load_topology(ROOT / "conf" / "topologies" / "wordcount-arrow.yaml")
    assert topo.components["split"].bolt.endswith("SplitBatchBolt")
    run = Run(tmp, _arrow_wordcount(tmp), 2).start()
    sentences, expected = _sentences(3000)
    _send_arrow(run, sentences, ["sentence"], per_message=200)
    wait_until(lambda: _counted(run) == sum(expected.values()), what="every word counted", timeout=60)
    kinds = {e["kind"] for s in run.cluster.slots for e in run.health(s)["executors"].values()}
    assert kinds == {"batch"}
    run.stop()
    assert _final_counts(tmp / "report") == expected


def test_a_replay_through_two_workers_backpressuring_each_other_finishes_with_exact_counts(tmp: Path) -> None:
    # A restart replays every sentence logged since the last checkpoint at full speed. Each
    # worker's split feeds count on both workers, and its sentences feed split on both: with
    # the transfer thread stopping at the hold limit, each split blocked on its full transfer
    # queue (held messages for the other's backpressured split), so neither split drained and
    # the replay never finished (the bench's wordcount hung there, at the default sizes).
    small = {
        "topology.executor.receive.buffer.size": 512,
        "topology.transfer.buffer.size": 512,
        "topology.backpressure.hold.max.size": 1024,
    }
    sentences, expected = _sentences(8000)
    first = Run(tmp, _arrow_wordcount(tmp, "report-1"), 2, **small, **{"topology.state.checkpoint.interval.ms": 0})
    first.start()
    _send_arrow(first, sentences, ["sentence"], per_message=200)
    wait_until(lambda: _counted(first) == sum(expected.values()), what="every word counted once", timeout=60)
    first.stop()  # no checkpoint ran: every sentence stays in the input logs, uncommitted

    second = Run(tmp, _arrow_wordcount(tmp, "report-2"), 2, **small).start()
    wait_until(lambda: _counted(second) == sum(expected.values()), what="the replay counted every word", timeout=90)
    second.stop()
    assert _final_counts(tmp / "report-2") == expected


def _mixed(record_dir: Path, first: str, second: str, third: str) -> dict[str, Any]:
    return {
        "name": "mixed",
        "conf": {"record.dir": str(record_dir), "topology.tick.tuple.freq.secs": 0.2},
        "components": [
            {"id": "in", "source": True, "bolt": first, "fields": ["key", "n"], "parallelism": 2},
            {
                "id": "stage1",
                "bolt": second,
                "parallelism": 2,
                "fields": ["key", "n"],
                "inputs": [{"from": "in", "grouping": "shuffle"}],
            },
            {
                "id": "stage2",
                "bolt": third,
                "parallelism": 2,
                "tasks": 3,
                "inputs": [{"from": "stage1", "grouping": "fields", "fields": ["key"]}],
            },
        ],
    }


@pytest.mark.parametrize(
    ("first", "second", "third"),
    [
        (PASS_BATCH, BATCH, TUPLE),  # batch -> batch -> tuple: rows become tuples at the end
        ("spark_storm.worker.bolt:PassThroughBolt", TUPLE, BATCH),  # tuple -> tuple -> batch: tuples assembled
        (PASS_BATCH, TUPLE, BATCH),  # batch -> tuple -> batch
    ],
    ids=["batch-batch-tuple", "tuple-tuple-batch", "batch-tuple-batch"],
)
def test_tuple_and_batch_bolts_mix_both_ways_with_fields_grouping(
    tmp: Path, first: str, second: str, third: str
) -> None:
    run = Run(tmp, _mixed(tmp / "records", first, second, third), 2).start()
    data = [[f"k{i % 23}", i] for i in range(2000)]
    _send_arrow(run, data[:1000], ["key", "n"], per_message=100)
    run.send_to_sources(data[1000:])  # msgpack rows: a batch source assembles them
    wait_until(
        lambda: (
            sum(
                t["executed"]
                for s in run.cluster.slots
                for e in run.health(s)["executors"].values()
                if e["component"] == "stage2"
                for t in e["tasks"].values()
            )
            >= 2000
        ),
        what="every row through the last stage",
        timeout=60,
    )
    records = run.stop()
    for component in ("stage1", "stage2"):
        assert sum(r["count"] for r in records[component].values()) == 2000, component
    owners: dict[str, set[int]] = {}
    for task, rec in records["stage2"].items():
        for key in rec["keys"]:
            owners.setdefault(key, set()).add(task)
    assert all(len(t) == 1 for t in owners.values()), owners  # fields grouping held across the kinds
    assert sum(Counter(r["keys"])["k0"] for r in records["stage2"].values()) == len(range(0, 2000, 23))
    assert all(r["ticks"] >= 1 for r in records["stage2"].values())  # ticks reach both kinds


def test_processed_covers_batch_bolts_and_conversions_across_workers(tmp: Path) -> None:
    topo = _mixed(tmp / "records", PASS_BATCH, BATCH, TUPLE)
    topo["conf"]["record.boom.component"] = "stage1"
    run = Run(tmp, topo, 2).start()
    keys = []
    for seq, task in enumerate(run.plan.component_tasks["in"]):
        slot = run.plan.task_slot[task]
        rows = [[f"k{(seq * 100 + i) % 11}", seq * 100 + i] for i in range(100)]
        header = BatchHeader("q", 0, 0, seq, 2, PROCESSED)
        msgs = [
            TaskMessage(task, arrow_payload(rows[:60], ["key", "n"])),
            TaskMessage(task, arrow_payload(rows[60:], ["key", "n"])),
        ]
        run.conns[slot].send_group(header, msgs)
        keys.append((slot, header.key))
    for slot, key in keys:
        assert run.conns[slot].wait_acks([key], PROCESSED, 60) == {key: PROCESSED}
    trees = [run.health(s)["acker"] for s in run.cluster.slots]
    assert sum(t["completed"] for t in trees) == 4  # one root per Arrow payload of a batch source
    assert sum(t["pending"] for t in trees) == 0
    # A batch bolt that raises fails its batch, and so the group.
    task = run.plan.component_tasks["in"][0]
    slot = run.plan.task_slot[task]
    bad = BatchHeader("q", 1, 0, 0, 1, PROCESSED)
    run.conns[slot].send_group(bad, [TaskMessage(task, arrow_payload([["boom", 1]], ["key", "n"]))])
    assert run.conns[slot].wait_acks([bad.key], PROCESSED, 60) == {bad.key: FAILED}
    records = run.stop()
    assert sum(r["count"] for r in records["stage2"].values()) == 200


def test_processed_with_tuple_rows_assembled_for_a_batch_bolt(tmp: Path) -> None:
    topo = _mixed(tmp / "records", "spark_storm.worker.bolt:PassThroughBolt", TUPLE, BATCH)
    run = Run(tmp, topo, 2).start()
    keys = []
    for seq, task in enumerate(run.plan.component_tasks["in"]):
        slot = run.plan.task_slot[task]
        msgs = [TaskMessage(task, msgpack.packb([f"k{i % 5}", i])) for i in range(150)]
        header = BatchHeader("q", 0, 0, seq, len(msgs), PROCESSED)
        run.conns[slot].send_group(header, msgs)
        keys.append((slot, header.key))
    for slot, key in keys:
        assert run.conns[slot].wait_acks([key], PROCESSED, 60) == {key: PROCESSED}
    trees = [run.health(s)["acker"] for s in run.cluster.slots]
    assert sum(t["completed"] for t in trees) == 300  # one root per source tuple
    records = run.stop()
    assert sum(r["count"] for r in records["stage2"].values()) == 300
