"""Bolts for the worker integration tests (imported by worker processes)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TextIO

import msgpack

from spark_storm.codec.columnar import ColumnarBatch
from spark_storm.codec.tuples import CHECKPOINT_STREAM, Tuple
from spark_storm.messaging import IClient, TaskMessage
from spark_storm.state.files import EmbeddedBackend, FileTaskStore
from spark_storm.transport import tcp
from spark_storm.transport._base import as_batch
from spark_storm.worker.bolt import BatchBolt, BatchOutputCollector, Bolt, OutputCollector, TopologyContext
from spark_storm.worker.spout import Spout, SpoutOutputCollector
from spark_storm.worker.stateful import KeyValueState, StatefulBatchBolt, StatefulBolt


class RecordingBolt(Bolt):
    """Counts what it gets per key, forwards (key, n) when it declares outputs, and writes
    ``<record.dir>/<component>-<task>.json`` at cleanup."""

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        super().prepare(conf, context, collector)
        self.keys: Counter[str] = Counter()
        self.broadcast = 0
        self.ticks = 0
        self.delay = float(conf.get("record.delay.s", 0))
        self.forward = bool(context.output_fields)
        self.journal: TextIO | None = None
        if conf.get("record.journal"):  # every tuple as it executes, so a SIGKILLed worker's work shows too
            name = f"journal-{context.component_id}-{context.task_id}-{os.getpid()}.jsonl"
            self.journal = (Path(str(conf["record.dir"])) / name).open("a", buffering=1)

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            self.ticks += 1
            return
        if tup.source_task == -1 and tup.stream == "default" and tup.source_component == "__client" and not tup.fields:
            self.broadcast += 1
            return
        key = str(tup.values[0])
        boom_at = self.conf.get("record.boom.component")
        if key == "boom" and boom_at in (None, self.context.component_id):
            msg = "boom on purpose"
            raise RuntimeError(msg)
        if self.delay:
            time.sleep(self.delay)
        self.keys[key] += 1
        if self.journal is not None:
            self.journal.write(json.dumps([key, tup.values[1]]) + "\n")
        if self.forward:
            self.collector.emit([key, tup.values[1]], anchors=tup)
        self.collector.ack(tup)

    def cleanup(self) -> None:
        name = f"{self.context.component_id}-{self.context.task_id}"
        if self.conf.get("record.per.instance"):  # a task that moves between workers records twice
            name += f"-{self.context.worker.replace(':', '_')}-{id(self)}"
        out = Path(str(self.conf["record.dir"])) / f"{name}.json"
        out.write_text(
            json.dumps(
                {
                    "component": self.context.component_id,
                    "task": self.context.task_id,
                    "count": sum(self.keys.values()),
                    "keys": self.keys,
                    "broadcast": self.broadcast,
                    "ticks": self.ticks,
                }
            )
        )


class DirectEmitter(RecordingBolt):
    """Sends each tuple to one chosen task of the consumer with emit_direct."""

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            return
        n = int(tup.values[1])
        targets = self.conf["direct.targets"]
        self.keys[str(tup.values[0])] += 1
        self.collector.emit_direct(targets[n % len(targets)], [tup.values[0], n])
        self.collector.ack(tup)


class BatchRecordingBolt(BatchBolt):
    """The columnar twin of RecordingBolt: counts rows per key (column 0), forwards the
    batch when it declares outputs, records ticks and batch sizes, writes
    ``<record.dir>/<component>-<task>.json`` at cleanup."""

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: BatchOutputCollector) -> None:
        super().prepare(conf, context, collector)
        self.keys: Counter[str] = Counter()
        self.ticks = 0
        self.batches = 0
        self.kinds: Counter[str] = Counter()
        self.forward = bool(context.output_fields)

    def execute_batch(self, batch: ColumnarBatch) -> None:
        if batch.is_tick:
            self.ticks += 1
            return
        keys = [str(k) for k in batch.data.column(0).to_pylist()]
        if "boom" in keys and self.conf.get("record.boom.component") in (None, self.context.component_id):
            msg = "boom on purpose"
            raise RuntimeError(msg)
        self.batches += 1
        self.kinds[batch.source_component] += 1
        self.keys.update(keys)
        if self.forward:
            self.collector.emit_batch(batch.data, anchors=batch)
        self.collector.ack(batch)

    def cleanup(self) -> None:
        out = Path(str(self.conf["record.dir"])) / f"{self.context.component_id}-{self.context.task_id}.json"
        out.write_text(
            json.dumps(
                {
                    "component": self.context.component_id,
                    "task": self.context.task_id,
                    "count": sum(self.keys.values()),
                    "keys": self.keys,
                    "ticks": self.ticks,
                    "batches": self.batches,
                    "sources": self.kinds,
                    "broadcast": 0,
                }
            )
        )


class EventLogBolt(Bolt):
    """Appends the event id (``values[1]``) of every tuple to its own log under ``record.dir`` before
    acking it, so what a bolt recorded survives a worker that is cut off or killed; forwards
    (anchored) when it declares outputs."""

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        super().prepare(conf, context, collector)
        name = f"{context.component_id}-{context.task_id}-{context.worker.replace(':', '_')}-{os.getpid()}-{id(self)}"
        self.log = (Path(str(conf["record.dir"])) / f"{name}.log").open("a", encoding="ascii", buffering=1)
        self.forward = bool(context.output_fields)

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            return
        self.log.write(f"{tup.values[1]}\n")  # line-buffered: written before the ack
        if self.forward:
            self.collector.emit([tup.values[0], tup.values[1]], anchors=tup)
        self.collector.ack(tup)

    def cleanup(self) -> None:
        self.log.close()


def read_event_logs(directory: Path, component: str) -> Counter[int]:
    """How many times each event id was recorded by ``component`` (over every log of every worker)."""
    seen: Counter[int] = Counter()
    for path in directory.glob(f"{component}-*.log"):
        seen.update(int(line) for line in path.read_text(encoding="ascii").splitlines() if line)
    return seen


class LatestCountBolt(Bolt):
    """(word, count) -> the latest count per word, written to ``<record.dir>/latest-<task>.json`` as it changes."""

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        super().prepare(conf, context, collector)
        self.latest: dict[str, int] = {}
        self.out = Path(str(conf["record.dir"])) / f"latest-{context.task_id}.json"
        self.seen = 0

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            self.out.write_text(json.dumps({"latest": self.latest, "seen": self.seen}))
            return
        word, count = tup.values[0], int(tup.values[1])
        self.latest[word] = max(count, self.latest.get(word, 0))
        self.seen += 1
        self.collector.ack(tup)

    def cleanup(self) -> None:
        self.out.write_text(json.dumps({"latest": self.latest, "seen": self.seen}))


class ReliableSpout(Spout):
    """Emits ``spout.count`` tuples (key, n) with message id n (every tenth keyed ``boom``), then nothing;
    writes the ids it heard acked and failed to ``<record.dir>/spout-<task>.record`` at close."""

    def open(self, conf: Mapping[str, Any], context: TopologyContext, collector: SpoutOutputCollector) -> None:
        super().open(conf, context, collector)
        self.n = 0
        self.count = int(conf.get("spout.count", 100))
        self.acked: list[int] = []
        self.failed: list[int] = []

    def next_tuple(self) -> None:
        if self.n < self.count:
            key = "boom" if self.n % 10 == 0 else f"k{self.n % 7}"
            self.collector.emit([key, self.n], message_id=self.n)
            self.n += 1

    def ack(self, message_id: Any) -> None:
        self.acked.append(message_id)

    def fail(self, message_id: Any) -> None:
        self.failed.append(message_id)

    def close(self) -> None:
        out = Path(str(self.conf["record.dir"])) / f"spout-{self.context.task_id}.record"
        out.write_text(json.dumps({"acked": sorted(self.acked), "failed": sorted(self.failed)}))


class ValuesForwarder(Bolt):
    """Forwards every tuple's values unchanged (anchored), so they cross to another worker."""

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            return
        self.collector.emit(tup.values, anchors=tup)
        self.collector.ack(tup)


class SlowForwarder(ValuesForwarder):
    """A forwarder whose first task takes ``forward.delay.s`` per tuple (the others do not wait).

    A test rolls back while that task is inside a long batch, with its output still to go.
    """

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        super().prepare(conf, context, collector)
        first = context.task_index == 0
        self.delay = float(conf.get("forward.delay.s", 0)) if first else 0.0

    def execute(self, tup: Tuple) -> None:
        if self.delay and not tup.is_tick:
            time.sleep(self.delay)
        super().execute(tup)


class ValuesLog(Bolt):
    """Appends every tuple's values, as the codec packs them, to ``<record.dir>/values-<task>.bin``.

    A value of ``record.unencodable.key`` in the first field is re-emitted with a value no
    codec carries (an ``object()``), to show that such a tuple fails alone.
    """

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        super().prepare(conf, context, collector)
        self.out = (Path(str(conf["record.dir"])) / f"values-{context.task_id}.bin").open("ab", buffering=0)

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            return
        from spark_storm.codec.serializer import pack_value

        data = pack_value(tup.values)
        self.out.write(len(data).to_bytes(4, "big") + data)
        self.collector.ack(tup)

    def cleanup(self) -> None:
        self.out.close()


def read_values(directory: Path) -> list[list[Any]]:
    """Every tuple a :class:`ValuesLog` wrote under ``directory``."""
    from spark_storm.codec.serializer import unpack_value

    out = []
    for path in sorted(directory.glob("values-*.bin")):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            n = int.from_bytes(data[pos : pos + 4], "big")
            out.append(unpack_value(data[pos + 4 : pos + 4 + n]))
            pos += 4 + n
    return out


class LedgerBolt(StatefulBolt):
    """Per key: [count, sum of n] in checkpointed state (the keyed ledger of docs/design/state.md).

    ``ledger.prepare.delay.s`` holds every checkpoint that long (a test kills a worker during one).
    """

    def init_state(self, state: KeyValueState) -> None:
        self.ledger = state

    def pre_prepare(self, txid: int) -> None:
        delay = float(self.conf.get("ledger.prepare.delay.s", 0))
        if delay and txid > 1:
            time.sleep(delay)

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            return
        delay = float(self.conf.get("ledger.delay.s", 0))
        if delay:
            time.sleep(delay)
        key, n = tup.values[0], tup.values[1]
        count, total = self.ledger.get(key, (0, 0))
        self.ledger.put(key, [count + 1, total + n])
        self.collector.ack(tup)


class LedgerBatchBolt(StatefulBatchBolt):
    """The ledger, columnar: per key [count, sum] with get_many / put_many."""

    def init_state(self, state: KeyValueState) -> None:
        self.ledger = state

    def execute_batch(self, batch: ColumnarBatch) -> None:
        if batch.is_tick:
            return
        import pyarrow as pa

        grouped = (
            pa.table({"key": batch.column("key"), "n": batch.column("n")})
            .group_by("key")
            .aggregate([("n", "count"), ("n", "sum")])
        )
        keys = grouped.column("key").to_pylist()
        old = self.ledger.get_many(keys, None)
        new = [
            [(o or (0, 0))[0] + c, (o or (0, 0))[1] + s]
            for o, c, s in zip(
                old, grouped.column("n_count").to_pylist(), grouped.column("n_sum").to_pylist(), strict=True
            )
        ]
        self.ledger.put_many(keys, new)
        self.collector.ack(batch)


class RunningCountBolt(StatefulBolt):
    """Per key: the running count in checkpointed state; emits (key, count) for every tuple."""

    def init_state(self, state: KeyValueState) -> None:
        self.counts = state

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            return
        key = tup.values[0]
        n = self.counts.get(key, 0) + 1
        self.counts.put(key, n)
        self.collector.emit([key, n], anchors=tup)
        self.collector.ack(tup)


class _GatedTaskStore(FileTaskStore):
    """An embedded task store whose writes wait while ``<gate>/closed`` exists (at most 60 s).

    Each write first leaves ``<gate>/writing-t<task>-e<epoch>``, so a test sees it waiting.
    """

    def __init__(self, task: int, directory: Path, gate: Path) -> None:
        super().__init__(task, directory)
        self.gate = gate

    def write_encoded(self, epoch: int, full: bool, parts: Sequence[bytes]) -> int:
        (self.gate / f"writing-t{self.task}-e{epoch}").touch()
        deadline = time.monotonic() + 60
        while (self.gate / "closed").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return super().write_encoded(epoch, full, parts)


class GatedBackend(EmbeddedBackend):
    """The embedded backend with gated changelog writes (provider settings ``dir`` and ``gate``)."""

    def __init__(self, topology: str, settings: Mapping[str, Any]) -> None:
        super().__init__(topology, settings["dir"])
        self.gate = Path(settings["gate"])

    def task_store(self, task: int) -> FileTaskStore:
        return _GatedTaskStore(task, self.root / f"task-{task}", self.gate)


def _barrier_epoch(payload: bytes) -> int | None:
    """The epoch of a checkpoint barrier's payload ([source task, "$checkpoint", [epoch, generation]]), or None."""
    try:
        decoded = msgpack.unpackb(payload)
    except Exception:
        return None
    if type(decoded) is list and len(decoded) == 3 and decoded[1] == CHECKPOINT_STREAM:
        return int(decoded[2][0])
    return None


class _HeldLinkClient(tcp.TcpClient):
    """A tcp client to another worker, steered by files in a gate directory, per destination task T.

    * while ``hold-t<T>`` exists, what it sends to T is held back (in order), and sent once
      the file is gone; each barrier it holds leaves ``held-barrier-t<T>-e<epoch>``;
    * ``garble-t<T>``: the next data payload (not a barrier) for T is replaced by bytes no
      decoder reads (msgpack's unused code 0xc1), once: the file becomes ``garbled-t<T>``.
    """

    def __init__(self, context: HeldLinkContext, topology_id: str, host: str, port: int) -> None:
        super().__init__(context, topology_id, host, port)
        self._gate = context.gate
        self._lock = threading.Lock()
        self._held: dict[int, list[TaskMessage]] = {}
        self._stopped = threading.Event()
        threading.Thread(target=self._release_loop, name="test-held-link", daemon=True).start()

    def send(self, messages: TaskMessage | Iterable[TaskMessage]) -> None:
        with self._lock:
            self._release()
            now = []
            for message in as_batch(messages):
                task = message.task
                epoch = _barrier_epoch(message.payload)
                if epoch is None and (self._gate / f"garble-t{task}").exists():
                    (self._gate / f"garble-t{task}").rename(self._gate / f"garbled-t{task}")
                    message = TaskMessage(task, b"\xc1 garbled by the test")
                if task in self._held or (self._gate / f"hold-t{task}").exists():
                    self._held.setdefault(task, []).append(message)
                    if epoch is not None:
                        (self._gate / f"held-barrier-t{task}-e{epoch}").touch()
                else:
                    now.append(message)
            if now:
                super().send(now)

    def _release(self) -> None:
        # Caller holds the lock.
        for task in [t for t in self._held if not (self._gate / f"hold-t{t}").exists()]:
            super().send(self._held.pop(task))

    def _release_loop(self) -> None:
        while not self._stopped.wait(0.01):
            with self._lock:
                if self._held:
                    self._release()

    def close(self) -> None:
        self._stopped.set()
        super().close()


class HeldLinkContext(tcp.Context):
    """tcp whose worker-to-worker clients hold back or garble messages as files in ``test.link.gate`` say."""

    alias: ClassVar[str] = "test-held-link"

    def __init__(self, conf: Any) -> None:
        super().__init__(conf)
        self.gate = Path(str(self.conf.get("test.link.gate") or "."))

    def _new_client(self, topology_id: str, host: str, port: int) -> IClient:
        return _HeldLinkClient(self, topology_id, host, port)
