"""What both demos stand on: their workers (a local cluster, or hosted by Spark), progress and checks.

``spark-storm demo`` (:mod:`~spark_storm.demos.wordcount`) and ``spark-storm demo --windows``
(:mod:`~spark_storm.demos.windows`) stream from the demo's own Spark into worker
processes, print progress every second, stop between micro-batches and check the result;
the pieces they share are here.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.cluster.state import ClusterState
from spark_storm.errors import StormError
from spark_storm.reports import WorkerMetrics
from spark_storm.spark import jobs
from spark_storm.spark.deployment import Deployment
from spark_storm.spark.progress import Sent
from spark_storm.topology import Plan, Slot, Topology, parse_slots, plan

__all__ = [
    "TRIGGER_S",
    "Hosted",
    "Sent",
    "Workers",
    "acked",
    "drained",
    "health",
    "kill_one",
    "logs_line",
    "stop_between_batches",
    "wind_down",
]

_T = TypeVar("_T")

#: Every demo query's trigger, in seconds.
TRIGGER_S = 1.0


class Hosted:
    """The demo's workers as its own Spark hosts them (``deploy()``), asked what a LocalCluster answers."""

    def __init__(self, topo: Deployment, topology: Topology) -> None:
        self.topo = topo
        self.topology = topology
        self._plan: Plan | None = None

    @property
    def plan(self) -> Plan:
        """The current assignment's plan; after stop() the last one seen (its tasks are the topology's)."""
        if self.topo.state in ("starting", "running"):
            self._plan = self.topo.plan() or self._plan
        return self._plan or plan(self.topology, "127.0.0.1:1")

    @property
    def slots(self) -> list[Slot]:
        workers = self.topo.workers()
        return parse_slots(",".join(workers)) if workers else []

    def health(self, slot: Slot, timeout: float = 5.0) -> WorkerMetrics:
        metrics = self.topo.worker_metrics(timeout).get(str(slot))
        if metrics is None:
            msg = f"worker {slot} of {self.topology.name} does not answer yet"
            raise StormError(msg)
        return metrics

    def kill(self, slot: Slot) -> None:
        """SIGKILL the supervisor task (Spark's Python worker) that runs ``slot``: Spark runs the task again."""
        with ClusterState(self.topo.zookeeper, self.topo.settings) as state:
            pids = [info.pid for info in state.supervisors().values() if slot in info.slots]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)


Workers = LocalCluster | Hosted


def health(cluster: Workers) -> list[WorkerMetrics]:
    """Every worker's ``/health`` that answers now (one starting or stopping is left out)."""
    out = []
    for slot in cluster.slots:
        try:
            out.append(cluster.health(slot, timeout=5))
        except (OSError, StormError):
            continue  # not up yet, or stopping: the caller reads again
    return out


def acked(healths: list[WorkerMetrics]) -> tuple[Counter[str], int]:
    """Tuples (rows) acked per component and the total queue depth."""
    per: Counter[str] = Counter()
    depth = 0
    for h in healths:
        for ex in h["executors"].values():
            per[ex["component"]] += sum(t["acked"] for t in ex["tasks"].values())
            depth += ex["queue"]["population"]
        depth += h["transfer_queue"]["population"]
    return per, depth


def stop_between_batches(
    query: Any,
    listener: Sent,
    timeout: float = 60.0,
    finish: Callable[[], Any] | None = None,
    finish_timeout: float = 300.0,
    checkpoint: str | Path | None = None,
) -> bool:
    """Stop when no micro-batch is running, then wait for the listener to hear of the last one.

    Spark delivers progress events to listeners asynchronously: right after ``stop()`` the
    last batch's rows may not be counted yet, and the exact counts would be of fewer rows.
    When every micro-batch runs behind its trigger the stop cuts one, and ``finish`` starts
    the query again to run it to its end (:func:`~spark_storm.spark.jobs.finish_cut_batch`).
    ``timeout`` bounds the wait for a moment between batches, ``finish_timeout`` the second
    run and the wait for the listener.  With the query's ``checkpoint`` directory, a batch
    that began just before the stop counts as cut too.  Return False when a batch was cut
    and not finished (no ``finish``, or it failed).
    """
    between = jobs.stop_between_batches(query, timeout, checkpoint)
    if not between and finish is not None:
        print("the stop cut a micro-batch: running the query once more to finish it ...", flush=True)
        again = jobs.finish_cut_batch(finish, finish_timeout)
        between = again is not None
        query = again if again is not None else query
    last = query.lastProgress
    target = int(last["batchId"]) if last else -1
    deadline = time.monotonic() + finish_timeout
    while listener.last_batch_id < target and time.monotonic() < deadline:
        time.sleep(0.01)
    return between


def drained(cluster: Workers, sent: int, killed: bool, timeout: float = 60.0) -> int:
    """Wait until every queue is empty and the entry bolts acked ``sent`` rows (or timeout); return the acked rows.

    After a kill the acks cannot add up to ``sent``: the killed worker's counts died with it and
    its restart counts from 0.  Then only the queues are waited for; what the demo checks after
    a kill is the committed state, which each micro-batch's commit made durable (before, the
    demo waited out the whole timeout after every ``--kill-worker``).
    """
    deadline = time.monotonic() + timeout
    while True:
        per, depth = acked(health(cluster))
        if (depth == 0 and (killed or per["sentences"] >= sent)) or time.monotonic() > deadline:
            return per["sentences"]
        time.sleep(0.2)


def kill_one(cluster: Workers) -> str:
    """SIGKILL a worker that runs a source task, and restart it (what a supervisor does); hosted: its task."""
    the_plan = cluster.plan
    hosting = {the_plan.task_slot[t] for t in the_plan.component_tasks["sentences"]}
    victim = next(s for s in cluster.slots if s in hosting)
    cluster.kill(victim)
    if isinstance(cluster, LocalCluster):
        cluster.start_worker(victim)
        return f"worker {victim}"
    return f"the supervisor task of worker {victim} (Spark runs it again)"


def logs_line(cluster: LocalCluster, codes: dict[Any, int]) -> str:
    """Name the workers' log files that exist, with the exit code of each worker that failed."""
    logs = [
        f"{path} (exit code {codes[slot]})" if codes.get(slot) else str(path)
        for slot, path in cluster.logs.items()
        if path.exists()
    ]
    if not logs:
        return f"the workers' folder {cluster.heartbeat_dir}: no worker wrote a log"
    return "the worker logs: " + ", ".join(logs)


def wind_down(
    query: Any,
    spark: Any,
    listener: Sent,
    cluster: Workers,
    killed: bool,
    answer: Callable[[], _T],
    what: str,
    finish: Callable[[], Any] | None = None,
    checkpoint: str | Path | None = None,
) -> tuple[bool, _T | None, int]:
    """End a demo's stream: stop the query between two micro-batches, let Spark compute the answer, drain.

    ``answer`` computes with Spark what the topology should have made of the rows sent
    (``what`` names it in the progress line); it runs only when rows were sent.  ``finish``
    starts the query again to finish a micro-batch the stop cut (:func:`stop_between_batches`;
    ``checkpoint``: the query's checkpoint directory, where a cut batch shows).
    Returns whether the query stopped between micro-batches, the answer (None when nothing
    was sent or Spark never started), and the rows the entry bolts acked.
    """
    between = True
    if query is not None:
        print("stopping the query between two micro-batches ...", flush=True)
        between = stop_between_batches(query, listener, finish=finish, checkpoint=checkpoint)
    result: _T | None = None
    if spark is not None and listener.rows:
        print(f"Spark counts {what} ...", flush=True)
        result = answer()
    print("letting the workers drain what they accepted ...", flush=True)
    processed = drained(cluster, listener.rows, killed)
    return between, result, processed
